package megatron

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/testkit"
)

// distWriteCases are sources (legacy torch fixtures, "dist/<case>" torch_dist
// ones) written as torch_dist at new degrees.
var distWriteCases = []struct {
	fixture string
	o       DistOptions
}{
	{"dist/core0_19_tp2_dp2_bf16_fullrs", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 4}}},
	{"dist/core0_19_tp2_dp2_bf16_fullrs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 2, DP: 1}, Core: Core018}},
	{"dist/core0_19_tp2_dp2_bf16_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 2, DP: 2}, Core: Core015}},
	{"dist/core0_14_tp2_dp4_fp32_fsms", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 1}}},
	{"dist/core0_19_tp2_fp32_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 1, LastStageLayers: 0}}},
	{"tp2_gqa_swiglu", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 2, DP: 1}}},
	{"tp1_pp1", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 2, DP: 1}, Core: Core018}},
	{"tp4_gqa_qkvbias", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2}}},
	{"tp1_pp4_untied", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 3, DP: 1, FirstStageLayers: 2}}},
}

// TestDistWriteRoundTrip: atomic -> torch_dist (ReshardDist) -> atomic
// (IndexDist, this package's torch_dist reader) holds every state of every
// parameter bit for bit, at the written degrees.
func TestDistWriteRoundTrip(t *testing.T) {
	atomics := map[string]string{}
	for i, c := range distWriteCases {
		if _, ok := atomics[c.fixture]; !ok {
			atomics[c.fixture] = convertFixture(t, c.fixture)
		}
		t.Run(fmt.Sprintf("%d_%s_tp%d_pp%d_core%s", i, c.fixture, c.o.TP, c.o.PP, c.o.Core), func(t *testing.T) {
			a := atomics[c.fixture]
			save := writeDist(t, a, c.o)
			tbl := indexDist(t, save, Options{})
			if d := tbl.Degrees; d.TP != c.o.TP || d.PP != c.o.PP {
				t.Errorf("degrees %+v, want TP %d PP %d", d, c.o.TP, c.o.PP)
			}
			sameAtomicStates(t, a, testkit.Convert(t, tbl, 2), true)
		})
	}
}

func writeDist(t *testing.T, a string, o DistOptions) string {
	t.Helper()
	r, err := atomic.OpenReader(a, atomic.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	save := filepath.Join(t.TempDir(), "save")
	o.NoSync = true
	if _, err := ReshardDist(context.Background(), r, save, o); err != nil {
		t.Fatal(err)
	}
	return save
}

// TestDistWriteRefused: unknown cores and sharding types are refused
// before anything is written.
func TestDistWriteRefused(t *testing.T) {
	a := convertFixture(t, "tp2_gqa_swiglu")
	for _, c := range []struct {
		o    DistOptions
		want string
	}{
		{DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 1}, Core: "0.16"}, "--megatron-core \"0.16\""},
		{DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 1}, OptimSharding: "fully_sharded_bucket_space"}, "--dist-optim-sharding"},
		{DistOptions{ReshardOptions: ReshardOptions{TP: 3, PP: 1, DP: 1}}, "does not divide"},
	} {
		r, err := atomic.OpenReader(a, atomic.ReaderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(t.TempDir(), "save")
		_, err = ReshardDist(context.Background(), r, dst, c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.o, err, c.want)
		}
		if _, err := os.Stat(dst); !os.IsNotExist(err) {
			t.Errorf("%s was created", dst)
		}
	}
}

// TestDistWriteTorchDCP reads written folders with real torch 2.6
// torch.distributed.checkpoint (_load_state_dict no_dist) and compares
// every tensor with the source fixture's live truth
// (testdata/check/check_megatron_dist_dcp.py). No Megatron source needed.
func TestDistWriteTorchDCP(t *testing.T) {
	cases := []struct {
		fixture string
		o       DistOptions
	}{
		{"core0_19_tp2_dp2_bf16_fullrs", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 1, DP: 4}}},
		{"core0_19_tp2_dp2_bf16_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 2, DP: 1}, Core: Core018}},
		{"core0_14_tp2_dp4_fp32_fsms", DistOptions{ReshardOptions: ReshardOptions{TP: 2, PP: 1, DP: 2}, Core: Core019}},
		{"core0_19_tp2_fp32_dprs", DistOptions{ReshardOptions: ReshardOptions{TP: 1, PP: 2, DP: 1}, Core: Core015}},
	}
	root := t.TempDir()
	var dirs []string
	for i, c := range cases {
		dir := filepath.Join(root, fmt.Sprintf("case%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		r, err := atomic.OpenReader(convertFixture(t, "dist/"+c.fixture), atomic.ReaderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c.o.NoSync = true
		if _, err := ReshardDist(context.Background(), r, filepath.Join(dir, "checkpoint"), c.o); err != nil {
			t.Fatal(err)
		}
		truth, err := os.ReadFile(testkit.Fixture("megatron_dist", c.fixture, "truth.pt"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "truth.pt"), truth, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tp"), []byte(fmt.Sprint(c.o.TP)), 0o644); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, filepath.Base(dir))
	}
	out := testkit.Torch2(t, root, filepath.Join(testkit.RepoRoot(), "testdata", "check", "check_megatron_dist_dcp.py"), dirs...)
	if n := strings.Count(out, "\nok ") + map[bool]int{true: 1}[strings.HasPrefix(out, "ok ")]; n != len(cases) {
		t.Fatalf("%d of %d cases passed:\n%s", n, len(cases), out)
	}
}
