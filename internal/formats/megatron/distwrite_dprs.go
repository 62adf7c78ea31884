package megatron

import (
	"fmt"
	"math"
	"sort"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/formats/dcp"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/layout"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// fullStates are the optimizer states written as fully_reshardable
// model-space keys (none with dp_reshardable: they go in buckets).
func (w *distWriter) fullStates() []string {
	if w.o.OptimSharding == DPReshardable {
		return nil
	}
	return []string{fragment.FP32, fragment.ExpAvg, fragment.ExpAvgSq}
}

// dprsStates are the bucket states and their key names.
var dprsStates = [][2]string{{fragment.FP32, "param"}, {fragment.ExpAvg, "exp_avg"}, {fragment.ExpAvgSq, "exp_avg_sq"}}

// dprsKeys adds the dp_reshardable optimizer (DISTWRITE.md): for every
// model-parallel rank G = t + T·s, DDP's buckets at the target DP as the
// loading run lays them out (listLayout, the legacy distrib_optim.pt
// writer's layout), one fp32 key per bucket and state of
// per_bucket_numel_unpadded elements, chunked as each DP rank's
// sharded_param_state_dp_reshardable saves it (its parameter ranges and the
// padding between them, zeros), and the byte items per_bucket_numel,
// per_bucket_numel_unpadded and the optimizer's state_dict entries.
// megatron/core/optimizer/distrib_optimizer.py at core_v0.19.0.
func (w *distWriter) dprsKeys() error {
	p := w.p
	a, err := p.targetArgsParsed(p.r.Dir + " (args at the target degrees)")
	if err != nil {
		return err
	}
	busbw, err := a.boolAttr("pad_buckets_for_high_nccl_busbw", false)
	if err != nil {
		return err
	}
	// param_layout.py bucket_end_divisor: lcm(DP, 128[, 2^16]), DP being
	// the buffer's data-parallel size (the expert-DP size for experts).
	divOf := func(d int) int64 {
		div := lcm(int64(d), 128)
		if busbw {
			div = lcm(div, 1<<16)
		}
		return div
	}
	var all []rsParam
	for _, st := range p.chunks {
		for _, list := range st {
			all = append(all, trained(list)...)
		}
	}
	for _, list := range all {
		for _, state := range dprsStates {
			if !p.hasState(list.src, state[0]) {
				return fmt.Errorf("%s: parameter %s has no %s state; Megatron's distributed optimizer saves param, exp_avg and exp_avg_sq", p.r.Dir, p.srcName(list.src), state[0])
			}
		}
	}
	ov, err := p.distGroups(all)
	if err != nil {
		return err
	}
	sds := []*pyobj.Dict{ov.(*pyobj.Dict)}
	if p.chained() {
		sds = nil
		for _, k := range ov.(*pyobj.Dict).Keys() {
			v, _ := ov.(*pyobj.Dict).Get(k)
			sds = append(sds, v.(*pyobj.Dict))
		}
	}
	dts := p.bufferDTypes(a)
	// Args saved without accumulate_allreduce_grads_in_fp32 (outside the
	// training loop) get arguments.py's bf16 rule: fp32 grads unless
	// grad_reduce_in_bf16 (megatron/training/arguments.py, core_v0.19.0).
	if _, ok := a.attr("accumulate_allreduce_grads_in_fp32"); !ok && p.dt == dtype.BFloat16 {
		bf, err := a.boolAttr("grad_reduce_in_bf16", false)
		if err != nil {
			return err
		}
		if !bf {
			dts[1] = pyobj.DType{DType: dtype.Float32}
		}
	}
	dtName := fmt.Sprintf("(torch.%s, torch.%s)", dts[0].(pyobj.DType).DType, dts[1].(pyobj.DType).DType)
	for _, dom := range w.dprsDomains(divOf, sds) {
		if err := w.dprsRank(a, dom, dts, dtName); err != nil {
			return err
		}
	}
	return nil
}

// dprsDomain is one data_parallel_group_idx of one (sub-)optimizer: its
// key prefix, rank file, buffers' parameters per model chunk with the rank
// of their tensors (rankTensor: the TP rank, the expert-TP rank for the
// expert optimizer's), data-parallel size and bucket-end divisor,
// state_dict entries.
type dprsDomain struct {
	pre   string
	rank  int
	s     int
	lists [][]rsParam
	tp    int
	total int64
	D     int
	div   int64
	sd    *pyobj.Dict
}

// dprsDomains lists the domains: G = t + T·s of the dense optimizer (all
// parameters when not chained) and, with expert parallelism, the expert
// optimizer's G = u + U·(e + EP·s) (optimizer/__init__.py
// expt_model_parallel_rank: the rank in the expert TP x EP x PP group),
// holding EP rank e's experts of stage s cut at expert-TP rank u, over the
// expert-DP size T·D/(EP·U); keys get chained_<k>. prefixes
// (ChainedOptimizer.sharded_state_dict with a non-fully-reshardable type).
func (w *distWriter) dprsDomains(divOf func(int) int64, sds []*pyobj.Dict) []dprsDomain {
	p := w.p
	T, D := p.o.TP, p.o.DP
	chained := p.chained()
	pre := func(k, g int) string {
		if chained {
			return fmt.Sprintf("chained_%d.optimizer.distributed.dp_group_idx_%d.", k, g)
		}
		return fmt.Sprintf("optimizer.distributed.dp_group_idx_%d.", g)
	}
	keep := func(s int, f func(rsParam) bool) [][]rsParam {
		out := make([][]rsParam, len(p.chunks[s]))
		for v, list := range p.chunks[s] {
			for _, rp := range trained(list) {
				if f(rp) {
					out[v] = append(out[v], rp)
				}
			}
		}
		return out
	}
	var doms []dprsDomain
	for s := range p.chunks {
		for t := 0; t < T; t++ {
			G := t + T*s
			doms = append(doms, dprsDomain{pre: pre(0, G), rank: G, s: s, tp: t, total: p.stageNumel(t, s), D: D, div: divOf(D), sd: sds[0],
				lists: keep(s, func(rp rsParam) bool { return !chained || !rp.routed })})
		}
	}
	if !chained {
		return doms
	}
	U, EP := p.etp, p.ep
	nle, De := p.experts/EP, T*D/(EP*U)
	for s := range p.chunks {
		for e := 0; e < EP; e++ {
			for u := 0; u < U; u++ {
				G := u + U*(e+EP*s)
				doms = append(doms, dprsDomain{pre: pre(1, G), rank: (u+U*e)%T + T*s, s: s, tp: u, total: p.stageNumel((u+U*e)%T, s), D: De, div: divOf(De), sd: sds[1],
					lists: keep(s, func(rp rsParam) bool { return rp.routed && rp.expert/nle == e })})
			}
		}
	}
	return doms
}

// bucketChunks are the chunks DP ranks 0..D-1 save of one bucket of u
// elements whose padded size splits into D shards of local elements: per
// rank its parameters' ranges (in[i] indexes list and lay, by start) and
// the gaps between them (zeros), nothing past u
// (sharded_param_state_dp_reshardable: a gap is saved unless it starts at
// or past the unpadded end); tp is the rank of the list's tensors
// (rankTensor).
func (w *distWriter) bucketChunks(rank, tp int, list []rsParam, lay layoutResult, in []int, u, local int64, D int) []*dwChunk {
	var out []*dwChunk
	gap := func(from, to int64) {
		if to > from {
			out = append(out, &dwChunk{rank: rank, offsets: []int64{from}, size: []int64{to - from}})
		}
	}
	for d := int64(0); d < int64(D); d++ {
		lo, hi := d*local, min((d+1)*local, u)
		cur := lo
		for _, i := range in {
			shape, pcs := w.p.rankTensor(list[i].src, tp)
			s, e := lay.start[i], lay.start[i]+torchfile.Numel(shape)
			a, b := max(s, lo), min(e, hi)
			if a >= b {
				continue
			}
			gap(cur, a)
			out = append(out, &dwChunk{rank: rank, offsets: []int64{a}, size: []int64{b - a}, src: list[i].src, pieces: layout.ClipPieces(pcs, a-s, b-a, 0)})
			cur = b
		}
		gap(cur, hi)
	}
	return out
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func lcm(a, b int64) int64 {
	if a <= 0 || b <= 0 || a > math.MaxInt64/b {
		return max(a, b)
	}
	return a / gcd(a, b) * b
}

// dprsRank adds model-parallel rank (s, t)'s dp_reshardable items: each
// bucket's states chunked per DP rank, the bucket sizes and the optimizer's
// state_dict() entries.
func (w *distWriter) dprsRank(a *Args, dom dprsDomain, dts pyobj.Tuple, dtName string) error {
	p := w.p
	pre, div, D, sd := dom.pre, dom.div, dom.D, dom.sd
	padded, unpadded := &pyobj.List{}, &pyobj.List{}
	for v, list := range dom.lists {
		lay := p.listLayout(a, dom.s, v, list, dom.tp, dom.total)
		var pads []pyobj.Value
		for b, u := range lay.unpadded {
			pads = append(pads, (u+div-1)/div*div)
			var in []int // the bucket's parameters by start
			for i := range list {
				if lay.bucket[i] == b {
					in = append(in, i)
				}
			}
			sort.Slice(in, func(x, y int) bool { return lay.start[in[x]] < lay.start[in[y]] })
			chunks := w.bucketChunks(dom.rank, dom.tp, list, lay, in, u, (u+div-1)/div*div/int64(D), D)
			for _, state := range dprsStates {
				k := &dwKey{key: fmt.Sprintf("%sgbuf_idx_%d.dtype_%s.bucket_idx_%d.%s", pre, v, dtName, b, state[1]), dt: dtype.Float32, size: []int64{u}}
				for _, ch := range chunks {
					c := *ch
					c.state = state[0]
					k.chunks = append(k.chunks, &c)
				}
				w.tensor = append(w.tensor, k)
			}
		}
		pd, ud := pyobj.NewDict(pyobj.PlainDict), pyobj.NewDict(pyobj.PlainDict)
		pd.Set(dts, &pyobj.List{Items: pads})
		ints := make([]pyobj.Value, len(lay.unpadded))
		for i, u := range lay.unpadded {
			ints[i] = u
		}
		ud.Set(dts, &pyobj.List{Items: ints})
		padded.Items = append(padded.Items, pd)
		unpadded.Items = append(unpadded.Items, ud)
	}
	// DistributedOptimizer.sharded_state_dict: every state_dict()
	// entry and the bucket sizes are ShardedObjects of the domain.
	objs := [][2]any{{"per_bucket_numel", padded}, {"per_bucket_numel_unpadded", unpadded}}
	for n := 0; n < sd.Len(); n++ {
		k, v := sd.Item(n)
		objs = append(objs, [2]any{k, v})
	}
	for _, o := range objs {
		data, err := dcp.SaveBytes(&pyobj.List{Items: []pyobj.Value{o[1]}})
		if err != nil {
			return err
		}
		w.items = append(w.items, &dwKey{key: fmt.Sprintf("%s%s/shard_0_1", pre, o[0]), data: data})
	}
	return nil
}
