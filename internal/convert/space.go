package convert

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/mapreduce"
	"github.com/ucp-project/ucp/internal/report"
)

// spaceMargin covers what the plan does not count: the torch files' heads
// and tails, the manifest, the optimizer state and the node records.
const SpaceMargin = 1 << 20

// checkSpace refuses a conversion whose output on this node does not fit
// in the free space of DST's file system (a source whose headers claim
// terabytes would otherwise write until the disk is full). reclaim counts
// the old DST.partial, which the run replaces, as free.
func checkSpace(dst string, plan *mapreduce.Plan, node int, reclaim bool) error {
	var need int64
	for _, tk := range plan.Tasks {
		if tk.Node == node {
			_, w := plan.IO(tk)
			need += w
		}
	}
	need += SpaceMargin
	return CheckFree(dst, need, "the conversion writes", reclaim)
}

// CheckFree refuses a run (convert, export, reshard) that writes need
// bytes into DST.partial when DST's file system has less free space
// (reclaim counts an old DST.partial, which the run empties first, as
// free). what says what the run writes ("the export writes up to").
func CheckFree(dst string, need int64, what string, reclaim bool) error {
	dir := fsutil.Existing(dst + atomic.PartialSuffix)
	free, _, err := fsutil.FSInfo(dir)
	if err != nil {
		return nil // cannot tell: the writes will say
	}
	if reclaim {
		free += fsutil.DiskUsage(dst + atomic.PartialSuffix)
	}
	if need > free {
		return fmt.Errorf("%s: %s %s (%d bytes) but %s has only %s (%d bytes) free; nothing written",
			dst, what, report.HumanBytes(need), need, dir, report.HumanBytes(free), free)
	}
	return nil
}

// AtomicBytes sums the bytes of an atomic checkpoint's state files: all
// of them, or only the fp32 weights (what export and reshard size their
// output by, plus SpaceMargin).
func AtomicBytes(m *atomic.Manifest, fp32Only bool) int64 {
	var n int64
	for _, p := range m.Params {
		for _, f := range p.Files {
			if !fp32Only || f.State == fragment.FP32 {
				n += f.Bytes
			}
		}
	}
	return n
}
