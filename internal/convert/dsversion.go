package convert

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ucp-project/ucp/internal/fragment"
)

// bareFrom is the first DeepSpeed release whose ZeRO-3 universal loader
// accepts the {'param': tensor} dict; 0.14.5 to 0.19.2 call .view(-1) on
// whatever torch.load returns (atomic/FORMAT.md).
var bareFrom = [3]int{0, 19, 3}

// parseDSVersion reads MAJOR.MINOR[.PATCH] (a missing patch is 0).
func parseDSVersion(s string) ([3]int, error) {
	var v [3]int
	parts := strings.Split(strings.TrimPrefix(s, "v"), ".")
	if len(parts) < 2 || len(parts) > 3 {
		return v, fmt.Errorf("--deepspeed-version %q: want MAJOR.MINOR or MAJOR.MINOR.PATCH, e.g. 0.14 or 0.19.3", s)
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return v, fmt.Errorf("--deepspeed-version %q: %q is not a version number", s, p)
		}
		v[i] = n
	}
	return v, nil
}

func versionLess(a, b [3]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
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
	if !versionLess(v, bareFrom) {
		return false, nil
	}
	if t.Format == "deepspeed-zero3" && t.Degrees.TP <= 1 {
		t.Notes = append(t.Notes, fmt.Sprintf("state files are bare tensors for DeepSpeed %s's ZeRO-3 universal loader (before 0.19.3 it cannot read the dict); ZeRO-1/2 universal loaders need the dict: convert again without --deepspeed-version for them", version))
		return true, nil
	}
	t.Notes = append(t.Notes, fmt.Sprintf("state files are dicts, as DeepSpeed %s's ZeRO-1/2 universal loader reads them; its ZeRO-3 universal loader cannot read them (nor load a %s source): for a ZeRO-3 resume use 'ucp reshard --to deepspeed --zero 3'", version, t.Format))
	return false, nil
}
