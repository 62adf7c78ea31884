//go:build unix

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestSideFilesRefused (issue 26 fault 3): --report and --arrow never write
// into the source or the DST being written, nor where a folder, link or
// FIFO is, and replace an existing file only with --force; a refused run
// changes nothing.
func TestSideFilesRefused(t *testing.T) {
	fifo := func(p string) {
		if err := syscall.Mkfifo(p, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		args func(ck, dir string) []string
		want string
	}{
		{"report onto a source file", func(ck, dir string) []string {
			return []string{"convert", "--quiet", "--report", filepath.Join(ck, "global_step3", "mp_rank_00_model_states.pt"), ck, filepath.Join(dir, "out")}
		}, "inside"},
		{"report with --force onto a source file", func(ck, dir string) []string {
			return []string{"convert", "--quiet", "--force", "--report", filepath.Join(ck, "latest"), ck, filepath.Join(dir, "out")}
		}, "inside"},
		{"report inside DST", func(ck, dir string) []string {
			return []string{"convert", "--quiet", "--report", filepath.Join(dir, "out", "run.json"), ck, filepath.Join(dir, "out")}
		}, "inside"},
		{"report inside DST.partial", func(ck, dir string) []string {
			return []string{"convert", "--quiet", "--report", filepath.Join(dir, "out.partial", "run.json"), ck, filepath.Join(dir, "out")}
		}, "inside"},
		{"existing svg without --force", func(ck, dir string) []string {
			// run.json's timeline goes to run.svg, which exists.
			writeFile(t, filepath.Join(dir, "run.svg"), []byte("mine"))
			return []string{"convert", "--quiet", "--report", filepath.Join(dir, "run.json"), ck, filepath.Join(dir, "out")}
		}, "already exists"},
		{"existing report without --force", func(ck, dir string) []string {
			writeFile(t, filepath.Join(dir, "run.json"), []byte("mine"))
			return []string{"convert", "--quiet", "--report", filepath.Join(dir, "run.json"), ck, filepath.Join(dir, "out")}
		}, "already exists"},
		{"report onto a folder", func(ck, dir string) []string {
			os.Mkdir(filepath.Join(dir, "run.json"), 0o755)
			return []string{"convert", "--quiet", "--force", "--report", filepath.Join(dir, "run.json"), ck, filepath.Join(dir, "out")}
		}, "a folder"},
		{"report onto a FIFO", func(ck, dir string) []string {
			fifo(filepath.Join(dir, "run.json"))
			return []string{"convert", "--quiet", "--force", "--report", filepath.Join(dir, "run.json"), ck, filepath.Join(dir, "out")}
		}, "a named pipe"},
		{"report onto a link", func(ck, dir string) []string {
			os.Symlink(filepath.Join(dir, "elsewhere"), filepath.Join(dir, "run.json"))
			return []string{"convert", "--quiet", "--force", "--report", filepath.Join(dir, "run.json"), ck, filepath.Join(dir, "out")}
		}, "symbolic link"},
		{"dry-run arrow onto a source file", func(ck, dir string) []string {
			return []string{"convert", "--dry-run", "--force", "--arrow", filepath.Join(ck, "global_step3", "mp_rank_00_model_states.pt"), ck, filepath.Join(dir, "out")}
		}, "inside"},
		{"inspect arrow onto a rank file", func(ck, dir string) []string {
			return []string{"inspect", "--force", "--arrow", filepath.Join(ck, "global_step3", "zero_pp_rank_0_mp_rank_00_optim_states.pt"), ck}
		}, "inside"},
		{"inspect arrow's plan onto a source file", func(ck, dir string) []string {
			// t.arrow's plan goes to t.plan.arrow.
			writeFile(t, filepath.Join(ck, "t.plan.arrow"), []byte("mine"))
			return []string{"inspect", "--force", "--arrow", filepath.Join(ck, "t.arrow"), ck}
		}, "inside"},
		{"inspect arrow onto an existing file", func(ck, dir string) []string {
			writeFile(t, filepath.Join(dir, "t.arrow"), []byte("mine"))
			return []string{"inspect", "--arrow", filepath.Join(dir, "t.arrow"), ck}
		}, "already exists"},
		{"inspect arrow onto a FIFO", func(ck, dir string) []string {
			fifo(filepath.Join(dir, "t.plan.arrow"))
			return []string{"inspect", "--force", "--arrow", filepath.Join(dir, "t.arrow"), ck}
		}, "a named pipe"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ck := realCkpt(t)
			dir := t.TempDir()
			args := tc.args(ck, dir)
			before := fmt.Sprint(snapTree(t, filepath.Dir(ck)), snapTree(t, dir))
			r := ucpWithin(t, 60e9, nil, args...)
			if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want a refusal saying %q", r.code, r.stderr, tc.want)
			}
			if after := fmt.Sprint(snapTree(t, filepath.Dir(ck)), snapTree(t, dir)); after != before {
				t.Errorf("the files changed:\n%s\nnow\n%s", before, after)
			}
		})
	}
	// With --force an existing report file is replaced.
	ck, dir := realCkpt(t), t.TempDir()
	rep := filepath.Join(dir, "run.json")
	writeFile(t, rep, []byte("old"))
	if r := ucp(t, nil, "convert", "--quiet", "--force", "--report", rep, ck, filepath.Join(dir, "out")); r.code != 0 {
		t.Fatal(r.stderr)
	}
	if b, err := os.ReadFile(rep); err != nil || !strings.HasPrefix(string(b), "{") {
		t.Errorf("report not replaced: %q %v", b, err)
	}
}
