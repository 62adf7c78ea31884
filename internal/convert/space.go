package convert

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/mapreduce"
	"github.com/ucp-project/ucp/internal/report"
)

// spaceMargin covers what the plan does not count: the torch files' heads
// and tails, the manifest, the optimizer state and the node records.
const spaceMargin = 1 << 20

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
	need += spaceMargin
	dir := fsutil.Existing(dst + atomic.PartialSuffix)
	free, _, err := fsutil.FSInfo(dir)
	if err != nil {
		return nil // cannot tell: the writes will say
	}
	if reclaim {
		free += fsutil.DiskUsage(dst + atomic.PartialSuffix)
	}
	if need > free {
		return fmt.Errorf("%s: the conversion writes %s (%d bytes) but %s has only %s (%d bytes) free; nothing written",
			dst, report.HumanBytes(need), need, dir, report.HumanBytes(free), free)
	}
	return nil
}
