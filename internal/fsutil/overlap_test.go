package fsutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckOverlap(t *testing.T) {
	root := t.TempDir()
	ck := filepath.Join(root, "ck")
	if err := os.MkdirAll(filepath.Join(ck, "global_step3"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ck, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ src, dst, want string }{
		{"ck", "ck", "the source"},
		{"ck/global_step3", "ck", "contains the source"},
		{"ck/global_step3", "ck/global_step3/..", "contains the source"},
		{"ck", "ck/out", "inside the source"},
		{"ck", "link", "the source"},
		{"link/global_step3", "ck", "contains the source"},
		{"ck", "link/global_step3/new/deeper", "inside the source"},
		{"ck.partial", "ck", "the source"}, // DST.partial is removed and refilled
		{"ck", "other", ""},
		{"ck/global_step3", "ck/global_step3_universal", ""},
		{"ck", "ck2", ""},
	}
	for _, tc := range tests {
		t.Run(tc.src+"->"+tc.dst, func(t *testing.T) {
			if tc.src == "ck.partial" {
				if err := os.MkdirAll(filepath.Join(root, "ck.partial"), 0o755); err != nil {
					t.Fatal(err)
				}
				defer os.Remove(filepath.Join(root, "ck.partial"))
			}
			err := CheckOverlap(filepath.Join(root, tc.src), filepath.Join(root, tc.dst), ".partial")
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
