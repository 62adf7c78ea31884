package multinode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAssign: every unit goes to exactly one node, largest first to the
// least loaded one, lowest rank on a tie.
func TestAssign(t *testing.T) {
	for _, c := range []struct {
		sizes []int64
		n     int
		want  string
	}{
		{[]int64{10, 10, 10, 10}, 2, "[[0 2] [1 3]]"},
		{[]int64{5, 40, 5, 30, 10}, 2, "[[0 1] [2 3 4]]"},
		{[]int64{1, 1}, 3, "[[0] [1] []]"},
		{nil, 2, "[[] []]"},
		{[]int64{0, 0, 0}, 2, "[[0 2] [1]]"},
	} {
		units := make([]Unit, len(c.sizes))
		for i, b := range c.sizes {
			units[i] = Unit{Name: fmt.Sprint(i), Bytes: b}
		}
		if got := fmt.Sprint(Assign(units, c.n)); got != c.want {
			t.Errorf("%v over %d: %s, want %s", c.sizes, c.n, got, c.want)
		}
	}
}

// TestFolderRecords: a record whose file changed after the node wrote
// it is refused by the finalizer, naming the file and the node to rerun.
func TestFolderRecords(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "out")
	folder := func(node int) *Folder {
		return &Folder{Dst: dst, Place: Place{Node: node, Nodes: 2}, Plan: "p", Options: "o", NoSync: true,
			Units: []Unit{{"a", 1}, {"b", 1}},
			Write: func(_ context.Context, tmp string, units []int) ([]string, error) {
				var out []string
				for _, u := range units {
					name := fmt.Sprintf("f%d", u)
					if err := os.WriteFile(filepath.Join(tmp, name), []byte("data"), 0o644); err != nil {
						return nil, err
					}
					out = append(out, name)
				}
				return out, nil
			}}
	}
	if res, err := folder(0).Run(context.Background()); err != nil || res.AllDone {
		t.Fatalf("node 0: %+v %v", res, err)
	}
	if err := os.WriteFile(filepath.Join(dst+".partial", "f0"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := folder(1).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "f0 is not as node 0 wrote it (4 bytes): rerun node 0") {
		t.Fatalf("finalize over a changed file: %v", err)
	}
	if res, err := folder(0).Run(context.Background()); err != nil || !res.Finalized {
		t.Fatalf("rerun of node 0: %+v %v", res, err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "f1")); err != nil || string(b) != "data" {
		t.Fatalf("f1: %q %v", b, err)
	}
}
