package megatron

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/testkit"
)

// TestReshardAdamW loads the non-distributed optimizer of written folders
// into real torch.optim.AdamW (torch 1.13 on the host, 2.6 in the chroot),
// then takes a step (testdata/check/check_megatron_adamw.py): the step must
// be where AdamW keeps it, a per-parameter tensor, also from distributed-
// optimizer sources that saved it as a float and FusedAdam sources.
func TestReshardAdamW(t *testing.T) {
	cases := []struct {
		fixture string
		o       ReshardOptions
	}{
		{"tp2_dp2_distopt", ReshardOptions{TP: 1, PP: 1, DP: 1}},                        // float step (DistributedOptimizer, torch AdamW)
		{"same_tp2_pp2", ReshardOptions{TP: 2, PP: 1, DP: 1}},                           // float step, fp32 (FP32Optimizer)
		{"tp2_gqa_swiglu", ReshardOptions{TP: 1, PP: 2, DP: 1}},                         // tensor step
		{"tp2_dp2_distopt_f2", ReshardOptions{TP: 1, PP: 1, DP: 1, Optimizer: "adamw"}}, // int step (FusedAdam) asked as AdamW
	}
	root := t.TempDir()
	var dirs []string
	for i, c := range cases {
		r, err := atomic.OpenReader(convertFixture(t, c.fixture), atomic.ReaderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(root, fmt.Sprintf("case%d", i))
		if _, err := Reshard(context.Background(), r, dir, c.o); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, filepath.Base(dir))
	}
	script := filepath.Join(testkit.RepoRoot(), "testdata", "check", "check_megatron_adamw.py")
	t.Run("torch1", func(t *testing.T) {
		cmd := exec.Command(testkit.Python(t), append([]string{script, "10"}, dirs...)...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "ok ") && !strings.Contains(string(out), "\nok ") {
			t.Fatalf("torch.optim.AdamW load: %v\n%s", err, out)
		}
	})
	t.Run("torch2", func(t *testing.T) {
		out := testkit.Torch2(t, root, script, append([]string{"10"}, dirs...)...)
		if !strings.Contains(out, "ok ") {
			t.Fatalf("torch.optim.AdamW load (torch 2): %s", out)
		}
	})
}

// TestReshardFusedStep: asked for FusedAdam, the step is an int in every
// param group and no per-parameter state holds one.
func TestReshardFusedStep(t *testing.T) {
	r, err := atomic.OpenReader(convertFixture(t, "tp2_dp2_distopt"), atomic.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := planMegatron(r, ReshardOptions{TP: 1, PP: 1, DP: 1, Optimizer: "fused"})
	if err != nil {
		t.Fatal(err)
	}
	if p.style != stepFused {
		t.Fatalf("style %d", p.style)
	}
	if _, err := planMegatron(r, ReshardOptions{TP: 1, PP: 1, DP: 1, Optimizer: "sgd"}); err == nil || !strings.Contains(err.Error(), "adamw") {
		t.Fatalf("unknown optimizer: %v", err)
	}
	p, err = planMegatron(r, ReshardOptions{TP: 1, PP: 1, DP: 1})
	if err != nil || p.style != stepTorch {
		t.Fatalf("float step source: style %d, %v", p.style, err)
	}
}
