package megatron

import (
	"path/filepath"
	"sort"
	"testing"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/testkit"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// convertCheck indexes, converts and compares a checkpoint with a truth.
func convertCheck(t *testing.T, dir, truthPath string) *fragment.Table {
	t.Helper()
	tbl := index(t, dir, Options{})
	testkit.Check(t, testkit.Convert(t, tbl, 2), truthPath)
	return tbl
}

// TestDistribF1 rewrites the core 0.6 (F2) files of tp2_dp2_distopt_f2 as
// core <= 0.5 wrote them (F1): buffers keyed by the grad dtype alone, and,
// older still, bare tensors without per_bucket_numel.
func TestDistribF1(t *testing.T) {
	for _, bare := range []bool{false, true} {
		root, iter := fixtureCopy(t, "tp2_dp2_distopt_f2")
		for _, d := range []string{"mp_rank_00", "mp_rank_01"} {
			rewrite(t, filepath.Join(iter, d, distribFile), func(r pyobj.Value) pyobj.Value {
				in := r.(*pyobj.Dict)
				out := pyobj.NewDict(in.Kind)
				rekey := func(v pyobj.Value, unwrap bool) pyobj.Value {
					dd := v.(*pyobj.Dict)
					nd := pyobj.NewDict(dd.Kind)
					for i := 0; i < dd.Len(); i++ {
						_, val := dd.Item(i)
						if unwrap {
							st := val.(*pyobj.Dict)
							for j := 0; j < st.Len(); j++ {
								k, l := st.Item(j)
								st.Set(k, l.(*pyobj.List).Items[0])
							}
						}
						nd.Set(pyobj.DType{DType: dtype.Float32}, val)
					}
					return nd
				}
				for i := 0; i < in.Len(); i++ {
					k, v := in.Item(i)
					switch k {
					case "per_bucket_numel", "per_bucket_numel_unpadded":
						if bare {
							continue
						}
						l := v.(*pyobj.List)
						for j := range l.Items {
							l.Items[j] = rekey(l.Items[j], false)
						}
						out.Set(k, l)
					default:
						out.Set(k, rekey(v, bare))
					}
				}
				return out
			})
		}
		convertCheck(t, root, testkit.Fixture("megatron", "tp2_dp2_distopt_f2", "truth.pt"))
	}
}

// TestDistribCoalescedUnaligned repacks same_tp2_pp2's F3 buffers (one
// bucket each) without the 64-element alignment, as core 0.7 wrote them:
// the reader must notice from numel_unpadded and still convert exactly.
func TestDistribCoalescedUnaligned(t *testing.T) {
	src := testkit.Fixture("megatron", "same_tp2_pp2")
	orig := index(t, filepath.Join(src, "checkpoint"), Options{})
	// The runs each file's buffer holds, from the aligned layout.
	runs := map[string][][2]int64{}
	for _, p := range orig.Params {
		for _, f := range p.State(fragment.FP32).Frags {
			if filepath.Base(f.Src.Path) == distribFile {
				rel, _ := filepath.Rel(filepath.Join(src, "checkpoint"), f.Src.Path)
				runs[rel] = append(runs[rel], [2]int64{f.SrcStart, f.Len})
			}
		}
	}
	if len(runs) != 4 {
		t.Fatalf("%d distrib_optim.pt files", len(runs))
	}
	root := testkit.CopyTree(t, filepath.Join(src, "checkpoint"))
	for rel, rs := range runs {
		sort.Slice(rs, func(i, j int) bool { return rs[i][0] < rs[j][0] })
		var n int64
		for _, r := range rs {
			n += r[1]
		}
		rewrite(t, filepath.Join(root, rel), func(r pyobj.Value) pyobj.Value {
			g, _ := r.(*pyobj.Dict).Get(int64(0))
			_, sv := g.(*pyobj.Dict).Item(0)
			st := sv.(*pyobj.Dict)
			for _, k := range []string{"param", "exp_avg", "exp_avg_sq"} {
				v, _ := st.Get(k)
				b := v.(*torchfile.Blob)
				var data []byte
				for _, r := range rs {
					data = append(data, b.Data[4*r[0]:4*(r[0]+r[1])]...)
				}
				st.Set(k, torchfile.NewBlob(b.DType, []int64{n}, data))
			}
			st.Set("numel_unpadded", n)
			return r
		})
	}
	convertCheck(t, root, filepath.Join(src, "truth.pt"))
}
