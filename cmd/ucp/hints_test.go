package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/testkit"
)

// TestErrorsSayWhatToDo pins each error message of a common mistake.
func TestErrorsSayWhatToDo(t *testing.T) {
	ds := testkit.Fixture("deepspeed", "z1_fp32_dp2", "checkpoint")
	mg := testkit.Fixture("megatron", "tp2_dp2_distopt", "checkpoint")
	dcp := testkit.Fixture("dcp", "ddp_w3", "checkpoint")
	tmp := t.TempDir()
	atomicDir := filepath.Join(tmp, "atomic")
	if r := ucp(t, nil, "convert", "--quiet", ds, atomicDir); r.code != 0 {
		t.Fatal(r.stderr)
	}
	// Auto-detection gives the reason of the one format a folder partly
	// looks like: a missing model-state file, mixed bf16_ and plain files.
	noModel, mixed := filepath.Join(tmp, "no-model"), filepath.Join(tmp, "mixed")
	for _, d := range []string{noModel, mixed} {
		if err := os.CopyFS(d, os.DirFS(ds)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(noModel, "global_step3", "mp_rank_00_model_states.pt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(mixed, "global_step3", "zero_pp_rank_1_mp_rank_00_optim_states.pt"),
		filepath.Join(mixed, "global_step3", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
	}{
		{"detect-missing-model-state", []string{"convert", noModel, filepath.Join(tmp, "out")}},
		{"detect-mixed-bf16", []string{"inspect", mixed}},
		{"nonexistent", []string{"convert", filepath.Join(tmp, "nonexistent"), filepath.Join(tmp, "out")}},
		{"verify-source", []string{"verify", ds}},
		{"verify-plain-folder", []string{"verify", tmp + "/atomic/zero"}},
		{"export-source", []string{"export", "--to", "hf", ds, filepath.Join(tmp, "hf")}},
		{"convert-atomic", []string{"convert", atomicDir, filepath.Join(tmp, "again")}},
		{"tag-deepspeed", []string{"convert", "--tag", "global_step9", ds, filepath.Join(tmp, "out")}},
		{"tag-megatron", []string{"inspect", "--tag", "9", mg}},
		{"bool-flag", []string{"convert", "--check-replicas", "false", ds, filepath.Join(tmp, "out")}},
		{"convert-no-args", []string{"convert"}},
		{"convert-one-arg", []string{"convert", ds}},
		{"convert-unknown-flag", []string{"convert", "--bogus", ds, filepath.Join(tmp, "out")}},
		{"diff-no-args", []string{"diff"}},
		{"export-no-args", []string{"export"}},
		{"inspect-no-args", []string{"inspect"}},
		{"reshard-no-args", []string{"reshard"}},
		{"verify-no-args", []string{"verify"}},
		{"distcp", []string{"inspect", filepath.Join(dcp, "__0_0.distcp")}},
		{"arrow-without-dry-run", []string{"convert", "--arrow", filepath.Join(tmp, "t.arrow"), ds, filepath.Join(tmp, "out")}},
		{"arrow-atomic", []string{"inspect", "--arrow", filepath.Join(tmp, "t.arrow"), atomicDir}},
		{"arrow-file", []string{"inspect", "--arrow", filepath.Join(tmp, "t.arrow"), filepath.Join(dcp, ".metadata")}},
		{"arrow-plan-name", []string{"inspect", "--arrow", filepath.Join(tmp, "t.plan.arrow"), ds}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := ucp(t, nil, c.args...)
			if r.code == 0 {
				t.Fatalf("exit 0:\n%s", r.stdout)
			}
			golden(t, "errors/"+c.name+".golden", fmt.Sprintf("exit %d\n%s", r.code, r.stderr), tmp, "TMP", ds, "DS", mg, "MEGATRON", dcp, "DCP")
			if _, err := os.Stat(filepath.Join(tmp, "out")); err == nil {
				t.Fatal("a failed conversion left output")
			}
		})
	}
}

func TestExitMessage(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if msg, code := exitMessage(ctx, fmt.Errorf("parameter x: %w", context.Canceled)); msg != "ucp: interrupted, nothing written" || code != 130 {
		t.Errorf("interrupted: %q %d", msg, code)
	}
	if msg, code := exitMessage(context.Background(), &exitError{2, fmt.Errorf("bad")}); msg != "ucp: bad" || code != 2 {
		t.Errorf("exitError: %q %d", msg, code)
	}
	if _, code := exitMessage(context.Background(), context.Canceled); code != 1 {
		t.Errorf("a cancel that is not an interrupt: exit %d", code)
	}
}

// TestHelpText: no doubled defaults, no line past 100 columns in convert's
// long help.
func TestHelpText(t *testing.T) {
	for _, cmd := range []string{"convert", "inspect", "diff", "export", "verify"} {
		r := ucp(t, nil, cmd, "--help")
		for _, l := range strings.Split(r.stdout, "\n") {
			if strings.Count(l, "(default") > 1 {
				t.Errorf("%s --help doubles a default: %q", cmd, l)
			}
		}
		long := strings.SplitN(r.stdout, "Usage:", 2)[0]
		if cmd == "inspect" {
			// Every pattern and column the listing shows is explained.
			for k := fragment.Unique; k <= fragment.ShardNC; k++ {
				if !strings.Contains(long, "\n  "+k.String()+" ") {
					t.Errorf("inspect --help does not explain %s", k)
				}
			}
			for _, w := range []string{"SHARDS", "FRAGS", "PADDING", "DTYPE", "averaged copies", "--filter", "--layers", "--all"} {
				if !strings.Contains(long, w) {
					t.Errorf("inspect --help does not explain %s", w)
				}
			}
		}
		for _, l := range strings.Split(long, "\n") {
			if len(l) > 80 {
				t.Errorf("%s --help: line of %d characters: %q", cmd, len(l), l)
			}
		}
	}
}
