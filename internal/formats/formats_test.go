package formats

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/testkit"
)

// megatronFolder copies a DCP fixture and adds a metadata.json, as Megatron's
// dist_checkpointing does; with tracker set it is put in iter_0000003 of a
// save folder with latest_checkpointed_iteration.txt. It returns the path a
// user would give.
func megatronFolder(t *testing.T, metadata string, tracker bool) string {
	t.Helper()
	src := testkit.Fixture("dcp", "fsdp2_w2", "checkpoint")
	save := t.TempDir()
	dir := save
	if tracker {
		dir = filepath.Join(save, "iter_0000003")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(save, "latest_checkpointed_iteration.txt"), []byte("3"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, dcp.MegatronMetadataFile), []byte(metadata), 0o644); err != nil {
		t.Fatal(err)
	}
	return save
}

// A DCP folder with Megatron's metadata.json is never read by the generic DCP
// reader: detection picks torch_dist, and --from dcp refuses it.
func TestMegatronDistNotReadAsDCP(t *testing.T) {
	const torchDist = `{"sharded_backend": "torch_dist", "sharded_backend_version": 1}`
	cases := []struct {
		name, metadata string
		tracker        bool
		from           string
		want           string // error substring
	}{
		{"iter folder, generic reader refused", torchDist, false, "dcp", `sharded_backend "torch_dist"), not a plain DCP checkpoint; read it with --from torch_dist`},
		{"save folder, generic reader refused", torchDist, true, "dcp", "no .metadata"},
		{"detected, no common state", torchDist, true, "", `neither common.pt nor a "common_state/shard_0_1" item`},
		{"zarr backend", `{"sharded_backend": "zarr"}`, false, "", `sharded_backend "zarr", which ucp does not read`},
		{"metadata.json without a backend", `{"format": 1}`, false, "", "no sharded_backend"},
		{"metadata.json that does not parse", `{`, false, "dcp", "not Megatron's dist_checkpointing metadata"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := megatronFolder(t, c.metadata, c.tracker)
			if dcp.Detect(path) {
				t.Errorf("dcp.Detect accepts a Megatron folder")
			}
			f, err := Detect(path)
			if err != nil || f.Name != "torch_dist" {
				t.Fatalf("Detect = %q, %v; want torch_dist", f.Name, err)
			}
			tab, err := Index(context.Background(), path, c.from, Options{Workers: 1})
			if err == nil {
				t.Fatalf("Index --from %q read %d parameters; want an error", c.from, len(tab.Params))
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
		})
	}
}

// TestPartlyClaimed: a folder Detect rejects is claimed by the format whose
// files are partly there, so Index can give that format's reason.
func TestPartlyClaimed(t *testing.T) {
	for _, c := range []struct {
		name  string
		files []string
		want  string
	}{
		{"empty", nil, ""},
		{"unrelated", []string{"notes.txt", "data/x.bin"}, ""},
		{"deepspeed optimizer files only", []string{"zero_pp_rank_0_mp_rank_00_optim_states.pt"}, "deepspeed"},
		{"deepspeed latest without its tag", []string{"latest"}, "deepspeed"},
		{"zero3 model states", []string{"latest", "global_step1/zero_pp_rank_0_mp_rank_00_model_states.pt"}, "zero3"},
		{"megatron tracker", []string{"latest_checkpointed_iteration.txt"}, "megatron"},
		{"megatron empty rank folder", []string{"mp_rank_00/"}, "megatron"},
		{"dcp data only", []string{"__0_0.distcp"}, "dcp"},
		{"dcp unfinished", []string{".metadata.tmp", "__0_0.distcp"}, "dcp"},
		{"two formats", []string{"latest", "__0_0.distcp"}, "deepspeed,dcp"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range c.files {
				p := filepath.Join(dir, f)
				if strings.HasSuffix(f, "/") {
					if err := os.MkdirAll(p, 0o755); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				content := "x"
				if f == "latest" {
					content = "global_step1"
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := strings.Join(partlyClaimed(nil, dir), ","); got != c.want {
				t.Errorf("claimed by %q, want %q", got, c.want)
			}
		})
	}
}
