package megatron

import (
	"reflect"
	"strings"
	"testing"
)

// TestExpertFiles: the (TP rank, EP rank, expert-TP rank) files of a stage
// follow Megatron's rank order (tp-cp-ep-dp-pp), and layouts Megatron
// cannot save are refused.
func TestExpertFiles(t *testing.T) {
	for _, c := range []struct {
		T, D, EP, ETP int
		want          []outFile
		err           string
	}{
		{T: 1, D: 2, EP: 2, ETP: 1, want: []outFile{{0, 0, 0}, {0, 1, 0}}},
		{T: 2, D: 2, EP: 2, ETP: 2, want: []outFile{{0, 0, 0}, {0, 1, 0}, {1, 0, 1}, {1, 1, 1}}},
		{T: 2, D: 1, EP: 2, ETP: 1, want: []outFile{{0, 0, 0}, {1, 1, 0}}},
		{T: 2, D: 2, EP: 4, ETP: 1, want: []outFile{{0, 0, 0}, {0, 2, 0}, {1, 1, 0}, {1, 3, 0}}},
		{T: 4, D: 1, EP: 2, ETP: 2, want: []outFile{{0, 0, 0}, {1, 0, 1}, {2, 1, 0}, {3, 1, 1}}},
		{T: 2, D: 1, EP: 4, ETP: 1, err: "does not divide the 2 ranks"},
		{T: 1, D: 2, EP: 1, ETP: 2, err: "would load one file"},
	} {
		got, err := expertFiles(c.T, c.D, c.EP, c.ETP)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("T %d D %d EP %d ETP %d: error %v, want %q", c.T, c.D, c.EP, c.ETP, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("T %d D %d EP %d ETP %d: %v, %v; want %v", c.T, c.D, c.EP, c.ETP, got, err, c.want)
		}
	}
}
