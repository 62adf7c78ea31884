package convert

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/formats/deepspeed"
	"github.com/ucp-project/ucp/internal/fragment"
)

// bareFrom is the first DeepSpeed release whose ZeRO-3 universal loader
// accepts the {'param': tensor} dict; 0.14.5 to 0.19.2 call .view(-1) on
// whatever torch.load returns (atomic/FORMAT.md).
var bareFrom = [3]int{0, 19, 3}

// parseDSVersion reads MAJOR.MINOR[.PATCH] (a missing patch is 0).
func parseDSVersion(s string) ([3]int, error) {
	v, err := deepspeed.ParseVersion(s)
	if err != nil {
		return v, fmt.Errorf("--deepspeed-version %w", err)
	}
	return v, nil
}

// bareStates decides the state-file layout for a target DeepSpeed release:
// bare tensors for a ZeRO-3 source at TP 1 before 0.19.3 (what that
// release's ds_to_universal writes and its ZeRO-3 loader needs); dicts
// otherwise, which every release's ZeRO-1/2 loader needs. A note says
// what the chosen layout cannot be loaded by.
func bareStates(t *fragment.Table, version string) (bool, error) {
	if version == "" {
		return false, nil
	}
	v, err := parseDSVersion(version)
	if err != nil {
		return false, err
	}
	if !deepspeed.VersionLess(v, bareFrom) {
		return false, nil
	}
	if t.Format == "deepspeed-zero3" && t.Degrees.TP <= 1 {
		t.Notes = append(t.Notes, fmt.Sprintf("state files are bare tensors for DeepSpeed %s's ZeRO-3 universal loader (before 0.19.3 it cannot read the dict); ZeRO-1/2 universal loaders need the dict: convert again without --deepspeed-version for them", version))
		return true, nil
	}
	t.Notes = append(t.Notes, fmt.Sprintf("state files are dicts, as DeepSpeed %s's ZeRO-1/2 universal loader reads them; its ZeRO-3 universal loader cannot read them (nor load a %s source): for a ZeRO-3 resume use 'ucp reshard --to deepspeed --zero 3'", version, t.Format))
	return false, nil
}
