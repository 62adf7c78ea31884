package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// TestReshardThenInspect: ucp reshard writes a DeepSpeed folder that ucp
// inspect shows as a source checkpoint of the new degrees, for every stage.
func TestReshardThenInspect(t *testing.T) {
	dir := t.TempDir()
	atomic := filepath.Join(dir, "atomic")
	if r := ucp(t, nil, "convert", "--quiet", testkit.Fixture("deepspeed", "megatron_tp2_bf16opt_dp2", "checkpoint"), atomic); r.code != 0 {
		t.Fatal(r.stderr)
	}
	for _, c := range []struct {
		args []string
		want fragment.Degrees
	}{
		{[]string{"--dp", "3", "--zero", "2", "--tp", "1"}, fragment.Degrees{TP: 1, PP: 1, DP: 3, EP: 1, ZeRO: 2}},
		{[]string{"--dp", "1", "--zero", "1", "--tp", "2", "--bf16-optimizer"}, fragment.Degrees{TP: 2, PP: 1, DP: 1, EP: 1, ZeRO: 1}},
		{[]string{"--dp", "4", "--zero", "3"}, fragment.Degrees{TP: 1, PP: 1, DP: 4, EP: 1, ZeRO: 3}},
	} {
		save := filepath.Join(dir, strings.Join(c.args, ""))
		args := append([]string{"reshard", atomic, filepath.Join(save, "step3"), "--to", "deepspeed"}, c.args...)
		r := ucp(t, nil, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "latest naming step3") {
			t.Fatalf("%v: exit %d\n%s%s", c.args, r.code, r.stdout, r.stderr)
		}
		if b, err := os.ReadFile(filepath.Join(save, "latest")); err != nil || string(b) != "step3" {
			t.Errorf("latest = %q, %v", b, err)
		}
		rep := inspectJSON(t, save)
		if rep.Degrees != c.want || len(rep.Params) != 29 {
			t.Errorf("%v: inspect shows degrees %+v and %d parameters, want %+v and 29", c.args, rep.Degrees, len(rep.Params), c.want)
		}
	}
}

// inspectJSON is what ucp inspect --json says of the checkpoint at path.
func inspectJSON(t *testing.T, path string) checkpointJSON {
	t.Helper()
	r := ucp(t, nil, "inspect", "--json", path)
	if r.code != 0 {
		t.Fatal(r.stderr)
	}
	var rep checkpointJSON
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestReshardBadFlags(t *testing.T) {
	dir := t.TempDir()
	atomic := filepath.Join(dir, "atomic")
	if r := ucp(t, nil, "convert", "--quiet", testkit.Fixture("deepspeed", "z1_fp32_dp2", "checkpoint"), atomic); r.code != 0 {
		t.Fatal(r.stderr)
	}
	src := testkit.Fixture("deepspeed", "z1_fp32_dp2", "checkpoint")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{atomic, "x", "--dp", "2", "--zero", "1"}, "--to is required"},
		{[]string{atomic, "x", "--to", "megatronx", "--dp", "2", "--zero", "1"}, `unknown target format "megatronx"`},
		{[]string{atomic, "x", "--to", "deepspeed", "--zero", "1"}, "--dp is required"},
		{[]string{atomic, "x", "--to", "deepspeed", "--dp", "2"}, "--zero is required"},
		{[]string{atomic, "x", "--to", "deepspeed", "--dp", "2", "--zero", "5"}, "unknown ZeRO stage 5"},
		{[]string{atomic, "x", "--to", "deepspeed", "--dp", "2", "--zero", "1", "--dtype", "int3"}, "--dtype"},
		{[]string{src, "x", "--to", "deepspeed", "--dp", "2", "--zero", "1"}, "not an atomic one"},
	} {
		r := ucp(t, nil, append([]string{"reshard"}, c.args...)...)
		if r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want it to say %q", c.args, r.code, r.stderr, c.want)
		}
	}
	if _, err := os.Stat("x"); err == nil {
		t.Errorf("a failed reshard wrote x")
	}
}

// TestReshardMegatronThenInspect: ucp reshard --to megatron writes a save
// folder that ucp inspect shows as a Megatron checkpoint of the new degrees.
func TestReshardMegatronThenInspect(t *testing.T) {
	dir := t.TempDir()
	atomic := filepath.Join(dir, "atomic")
	if r := ucp(t, nil, "convert", "--quiet", testkit.Fixture("megatron", "pp2_vpp2_distopt", "checkpoint"), atomic); r.code != 0 {
		t.Fatal(r.stderr)
	}
	for _, c := range []struct {
		args []string
		want fragment.Degrees
	}{
		{[]string{"--tp", "2"}, fragment.Degrees{TP: 2, PP: 1, DP: 1, EP: 1}},
		{[]string{"--pp", "4", "--dp", "2"}, fragment.Degrees{TP: 1, PP: 4, DP: 2, EP: 1}},
		{[]string{"--tp", "2", "--pp", "2", "--vpp", "2"}, fragment.Degrees{TP: 2, PP: 2, DP: 1, EP: 1, VPP: 2}},
		{[]string{"--tp", "2", "--pp", "2", "--dp", "4", "--distributed-optimizer"}, fragment.Degrees{TP: 2, PP: 2, DP: 4, EP: 1, ZeRO: 1}},
	} {
		save := filepath.Join(dir, strings.Join(c.args, ""))
		r := ucp(t, nil, append([]string{"reshard", atomic, save, "--to", "megatron"}, c.args...)...)
		if r.code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", c.args, r.code, r.stdout, r.stderr)
		}
		rep := inspectJSON(t, save)
		if rep.Degrees != c.want || len(rep.Params) != 27 {
			t.Errorf("%v: inspect shows degrees %+v and %d parameters, want %+v and 27", c.args, rep.Degrees, len(rep.Params), c.want)
		}
	}
	if r := ucp(t, nil, "reshard", atomic, filepath.Join(dir, "x"), "--to", "megatron", "--zero", "1"); r.code == 0 || !strings.Contains(r.stderr, "--zero") {
		t.Errorf("--zero with --to megatron: exit %d, %s", r.code, r.stderr)
	}
	// torch_dist: an unknown megatron-core layout is refused by name before anything is written;
	// --megatron-core without torch_dist too.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--ckpt-format", "torch_dist", "--megatron-core", "0.17"}, `--megatron-core "0.17"`},
		{[]string{"--ckpt-format", "torch_dist", "--megatron-core", "0.19.0"}, `--megatron-core "0.19.0"`},
		{[]string{"--megatron-core", "0.19"}, "apply to --ckpt-format torch_dist"},
	} {
		x := filepath.Join(dir, "refused")
		r := ucp(t, nil, append([]string{"reshard", atomic, x, "--to", "megatron", "--tp", "1"}, c.args...)...)
		if r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want it to say %q", c.args, r.code, r.stderr, c.want)
		}
		if _, err := os.Stat(x); err == nil {
			t.Errorf("%v: a refused reshard wrote %s", c.args, x)
		}
	}
	// torch_dist with a virtual pipeline and the dp_reshardable optimizer reads back at its degrees.
	save := filepath.Join(dir, "dist_vpp")
	if r := ucp(t, nil, "reshard", atomic, save, "--to", "megatron", "--ckpt-format", "torch_dist", "--tp", "2", "--pp", "2", "--vpp", "2", "--dp", "2", "--dist-optim-sharding", "dp_reshardable"); r.code != 0 {
		t.Fatalf("torch_dist --vpp 2: exit %d\n%s", r.code, r.stderr)
	}
	rep := inspectJSON(t, save)
	if d := rep.Degrees; d.TP != 2 || d.PP != 2 || d.DP != 2 || len(rep.Params) != 27 {
		t.Errorf("torch_dist --vpp 2: inspect shows degrees %+v and %d parameters", d, len(rep.Params))
	}
}

// TestReshardTPNeedsLayout (issue 26 fault 6): reshard --tp cuts only what
// the atomic checkpoint records how to cut. A plain DeepSpeed source
// (saved at TP 1) is refused at --tp 3 naming a parameter, not cut into
// 342/342/340; a Megatron-DeepSpeed TP 2 source is refused at a --tp that
// does not divide its 4 heads, and written at --tp 2 and 1.
func TestReshardTPNeedsLayout(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		fixture string
		tp      string
		want    string // "" : written
	}{
		{"z1_fp32_dp2", "3", "does not record how this parameter is cut across tensor-parallel ranks"},
		{"z1_fp32_dp2", "2", "does not record how this parameter is cut across tensor-parallel ranks"},
		{"z1_fp32_dp2", "1", ""},
		{"megatron_tp2_bf16opt_dp2", "3", "does not divide the 4 attention heads"},
		{"megatron_tp2_bf16opt_dp2", "2", ""},
		{"megatron_tp2_bf16opt_dp2", "1", ""},
	} {
		a := filepath.Join(dir, c.fixture)
		if _, err := os.Stat(a); err != nil {
			if r := ucp(t, nil, "convert", "--quiet", testkit.Fixture("deepspeed", c.fixture, "checkpoint"), a); r.code != 0 {
				t.Fatal(r.stderr)
			}
		}
		dst := filepath.Join(dir, "out", c.fixture+c.tp, "step")
		r := ucp(t, nil, "reshard", "--quiet", a, dst, "--to", "deepspeed", "--dp", "2", "--zero", "2", "--tp", c.tp)
		switch {
		case c.want == "" && r.code != 0:
			t.Errorf("%s --tp %s: %s", c.fixture, c.tp, r.stderr)
		case c.want != "" && (r.code == 0 || !strings.Contains(r.stderr, c.want)):
			t.Errorf("%s --tp %s: exit %d, %q; want a refusal saying %q", c.fixture, c.tp, r.code, r.stderr, c.want)
		case c.want != "":
			if _, err := os.Lstat(filepath.Dir(dst)); !os.IsNotExist(err) {
				t.Errorf("%s --tp %s: refused, but wrote %s", c.fixture, c.tp, filepath.Dir(dst))
			}
		}
	}
}

// TestReshardDeepSpeedVersionAndConfig (issue 26 item 10): reshard --to
// deepspeed writes the source's ds_version (0.16.5 in these fixtures, not
// always 0.14.5) or --deepspeed-version's, checkpoint_parallel_dimensions
// only for 0.19.5 and later (as its engine saves it), and a ds_config of
// the target: its ZeRO stage, no stage-3 settings below stage 3, no fp32
// gradient accumulation for a ZeRO optimizer.
func TestReshardDeepSpeedVersionAndConfig(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		fixture, version, zero string
		wantVersion            string
		wantDims               bool
	}{
		{"deepspeed/bf16opt_z1_dp3", "", "2", "0.16.5", false},
		{"deepspeed/bf16opt_z1_dp3", "0.19.5", "1", "0.19.5", true},
		{"deepspeed/bf16opt_z1_dp3", "0.14", "2", "0.14", false},
		{"zero3/dp2_fp32_torch2", "", "1", "0.16.5", false},
	} {
		a := filepath.Join(dir, strings.ReplaceAll(c.fixture, "/", "_"))
		if _, err := os.Stat(a); err != nil {
			parts := strings.Split(c.fixture, "/")
			if r := ucp(t, nil, "convert", "--quiet", testkit.Fixture(parts[0], parts[1], "checkpoint"), a); r.code != 0 {
				t.Fatal(r.stderr)
			}
		}
		dst := filepath.Join(dir, "out", filepath.Base(a)+c.version+c.zero, "step")
		args := []string{"reshard", "--quiet", a, dst, "--to", "deepspeed", "--dp", "2", "--zero", c.zero}
		if c.version != "" {
			args = append(args, "--deepspeed-version", c.version)
		}
		if r := ucp(t, nil, args...); r.code != 0 {
			t.Fatalf("%v: %s", args, r.stderr)
		}
		files, _ := filepath.Glob(filepath.Join(dst, "*.pt"))
		if len(files) < 2 {
			t.Fatalf("%s: %d files", dst, len(files))
		}
		for _, path := range files {
			f, err := torchfile.Decode(path)
			if err != nil {
				t.Fatal(err)
			}
			d := pyobj.NewDec(path, f.Root)
			if v := d.Str("ds_version"); v != c.wantVersion {
				t.Errorf("%s: ds_version %q, want %q", path, v, c.wantVersion)
			}
			cfg := d.Dict("ds_config")
			zo := cfg.Dict("zero_optimization")
			if st := zo.Int("stage"); fmt.Sprint(st) != c.zero {
				t.Errorf("%s: ds_config stage %d, want %s", path, st, c.zero)
			}
			for _, k := range zo.AsDict().Keys() {
				if strings.HasPrefix(fmt.Sprint(k), "stage3_") {
					t.Errorf("%s: ds_config keeps %s for a ZeRO-%s target", path, k, c.zero)
				}
			}
			if dts, ok := cfg.OptDict("data_types"); ok {
				if g, ok := dts.Opt("grad_accum_dtype"); ok {
					t.Errorf("%s: ds_config keeps grad_accum_dtype %v for a ZeRO optimizer", path, g.Value())
				}
			}
			if strings.Contains(filepath.Base(path), "model_states") {
				dims, has := d.OptDict("checkpoint_parallel_dimensions")
				if has != c.wantDims {
					t.Errorf("%s: checkpoint_parallel_dimensions present %v, want %v", path, has, c.wantDims)
				}
				if has && (dims.Int("tp_degree") != 1 || dims.Int("pp_degree") != 1) {
					t.Errorf("%s: checkpoint_parallel_dimensions %v", path, pyobj.Repr(dims.Value()))
				}
			}
			if err := d.Err(); err != nil {
				t.Error(err)
			}
		}
	}
}
