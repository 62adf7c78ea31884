package megatron

import (
	"fmt"
	"strings"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// layoutRules are the differences between Megatron versions in how the
// DDP grad buffer places parameters (param_and_grad_buffer.py,
// DistributedOptimizer._compute_per_buffer_param_layout). Positions are
// tracked relative to the bucket start, which is always a multiple of 128
// (core >= 0.7) or of DP (older), so bucket-end padding never moves a
// parameter within its bucket.
type layoutRules struct {
	name        string
	align       int64 // parameter start alignment (64 from core 0.8, else 1)
	splitShared bool  // a shared embedding gets a bucket of its own (core >= 0.6)
	minTwo      bool  // a bucket closes on size only with > 1 params (core <= 0.5)
}

var (
	rulesHead = layoutRules{name: "core >= 0.8 (64-element alignment)", align: 64, splitShared: true}
	rules07   = layoutRules{name: "core 0.7 (no alignment)", align: 1, splitShared: true}
	rules06   = layoutRules{name: "core 0.6", align: 1, splitShared: true}
	rules05   = layoutRules{name: "core <= 0.5", align: 1, minTwo: true}
)

// layoutParam is what the layout needs of one parameter.
type layoutParam struct {
	numel  int64
	shared bool
}

// layoutResult places each parameter of a buffer: bucket and start within
// the bucket; unpadded[b] is bucket b's numel_unpadded.
type layoutResult struct {
	bucket   []int
	start    []int64
	unpadded []int64
}

// computeLayout walks the buffer's parameters in reverse (backprop order),
// as Megatron builds its grad buffer. bucketSize <= 0 means one bucket.
func computeLayout(params []layoutParam, bucketSize int64, r layoutRules) layoutResult {
	res := layoutResult{bucket: make([]int, len(params)), start: make([]int64, len(params))}
	var rel int64 // next start, relative to the current bucket
	n := 0        // params in the current bucket
	var end int64
	closeAt := func(e int64) {
		res.unpadded = append(res.unpadded, e)
		rel, n = 0, 0
	}
	for i := len(params) - 1; i >= 0; i-- {
		p := params[i]
		rel = pad(rel, r.align)
		if r.splitShared && p.shared && n > 0 {
			closeAt(rel)
		}
		end = rel + p.numel
		res.bucket[i], res.start[i] = len(res.unpadded), rel
		n++
		bySize := bucketSize > 0 && end >= bucketSize && (!r.minTwo || n > 1)
		if bySize || (r.splitShared && p.shared) {
			closeAt(end)
		} else {
			rel = end
		}
	}
	if n > 0 {
		res.unpadded = append(res.unpadded, end)
	}
	return res
}

func pad(x, d int64) int64 {
	if d <= 1 {
		return x
	}
	return (x + d - 1) / d * d
}

// buffer is one DDP buffer of a sub-optimizer: parameters of one model
// chunk with one (param dtype, grad dtype).
type buffer struct {
	chunk      int
	param      dtype.DType
	grad       dtype.DType
	params     []*localParam
	bucketSize int64
}

// buffers groups a rank's parameters into the buffers of one
// sub-optimizer (dense or expert), per chunk in first-seen dtype order;
// byGrad groups by grad dtype only (core <= 0.5 keys).
func (f *rankFile) buffers(a *Args, expert, byGrad bool) []*buffer {
	var total int64
	for _, lp := range f.params {
		total += lp.t.Numel()
	}
	var out []*buffer
	for v, list := range f.chunks {
		bs := bucketSize(a, f.rd.pp, v, total)
		var mine []*buffer
		for _, lp := range list {
			if lp.buffer || lp.expert != expert {
				continue
			}
			pd, gd := lp.t.DType, a.gradDType(lp.t.DType)
			if byGrad {
				pd = dtype.Invalid
			}
			var b *buffer
			for _, x := range mine {
				if x.param == pd && x.grad == gd {
					b = x
				}
			}
			if b == nil {
				b = &buffer{chunk: v, param: pd, grad: gd, bucketSize: bs}
				mine = append(mine, b)
			}
			b.params = append(b.params, lp)
		}
		out = append(out, mine...)
	}
	return out
}

// bucketSize is training.py's resolve_ddp_bucket_size with the per-chunk
// rule of get_model: buckets only with overlap_grad_reduce, on pipeline
// rank 0 and in chunk 0.
func bucketSize(a *Args, pp, chunk int, numParams int64) int64 {
	if !a.OverlapGradReduce || pp > 0 || chunk > 0 || a.OverlapParamGather {
		return 0
	}
	switch {
	case a.NumBuckets > 0:
		return numParams / a.NumBuckets
	case a.BucketSize > 0:
		return a.BucketSize
	}
	return max(40_000_000, 1_000_000*int64(max(a.denseDP(), 1)))
}

// distState is one sub-optimizer's entry of distrib_optim.pt.
type distState struct {
	coalesced bool                  // F3
	gbufs     map[int64]*pyobj.Dict // gbuf_idx -> {dtype key: state}
	perBucket *pyobj.List           // F2/F1 per_bucket_numel, or nil
	unpadded  *pyobj.List           // F2/F1 per_bucket_numel_unpadded, or nil
}

// parseDistrib splits distrib_optim.pt into per-sub-optimizer entries
// (nil where this rank is not DP rank 0 of that sub-optimizer's group).
func parseDistrib(path string, root pyobj.Value) ([]*distState, error) {
	dec := pyobj.NewDec(path, root)
	items := []pyobj.Dec{dec}
	switch root.(type) {
	case *pyobj.List: // one entry per sub-optimizer
		items = dec.AsList()
	}
	var out []*distState
	for i, ed := range items {
		if ed.Value() == nil {
			out = append(out, nil)
			continue
		}
		d := ed.AsDict()
		if err := dec.Err(); err != nil {
			return nil, err
		}
		ds := &distState{gbufs: map[int64]*pyobj.Dict{}}
		for n := 0; n < d.Len(); n++ {
			k, v := d.Item(n)
			switch kk := k.(type) {
			case string:
				switch kk {
				case "buckets_coalesced":
					ds.coalesced = ed.Bool(kk)
				case "per_bucket_numel":
					if v != nil {
						ds.perBucket = pyobj.As[*pyobj.List](ed.Key(kk), "list")
					}
				case "per_bucket_numel_unpadded":
					if v != nil {
						ds.unpadded = pyobj.As[*pyobj.List](ed.Key(kk), "list")
					}
				case "param_state_sharding_type", "sharding_type":
					return nil, fmt.Errorf("%s: entry %d is a %s distributed-optimizer state, which ucp does not read yet", path, i, pyobj.Repr(v))
				}
			case int64:
				ds.gbufs[kk] = ed.Dict(kk).AsDict()
			}
		}
		if err := dec.Err(); err != nil {
			return nil, err
		}
		if len(ds.gbufs) == 0 {
			return nil, fmt.Errorf("%s: entry %d holds no buffers (keys %s); unknown distributed-optimizer layout", path, i, pyobj.Repr(pyobj.Tuple(d.Keys())))
		}
		out = append(out, ds)
	}
	return out, nil
}

// dtypeKey decodes a buffer's dtype key: (param dtype, grad dtype), or a
// single grad dtype (core <= 0.5).
func dtypeKey(k pyobj.Value) (pd, gd dtype.DType, single bool, ok bool) {
	switch x := k.(type) {
	case pyobj.Tuple:
		if len(x) == 2 {
			a, ok1 := x[0].(pyobj.DType)
			b, ok2 := x[1].(pyobj.DType)
			return a.DType, b.DType, false, ok1 && ok2
		}
	case pyobj.DType:
		return dtype.Invalid, x.DType, true, true
	}
	return 0, 0, false, false
}

// mapDistributed reads the states of every sub-optimizer of a rank from
// distrib_optim.pt by recomputing the DDP buffer layout.
func (f *rankFile) mapDistributed(a *Args, root pyobj.Value, qkWD bool) error {
	path := f.rd.distrib
	entries, err := parseDistrib(path, root)
	if err != nil {
		return err
	}
	if len(entries) != len(f.subs) {
		return fmt.Errorf("%s: %d entries but %s has %d sub-optimizers", path, len(entries), f.rd.model, len(f.subs))
	}
	for i, sub := range f.subs {
		inner, err := innerOptimizer(f.rd.model, i, sub)
		if err != nil {
			return err
		}
		groups, flags, err := readGroups(f.rd.model, i, inner)
		if err != nil {
			return err
		}
		expert, err := subKind(f.rd.model, i, flags)
		if err != nil {
			return err
		}
		// Steps live in the param groups.
		for _, lp := range f.params {
			if lp.expert != expert {
				continue
			}
			if g := groupOf(flags, flagsOf(lp, qkWD)); g >= 0 {
				lp.step = stepOf(f.rd.model, nil, groups[g].AsDict())
			}
		}
		ds := entries[i]
		if ds == nil {
			continue // another rank of this sub-optimizer's DP group saved it
		}
		if err := f.mapEntry(a, path, i, ds, expert); err != nil {
			return err
		}
	}
	return nil
}

// subKind says whether a sub-optimizer holds expert parameters.
func subKind(path string, i int, flags []groupFlags) (bool, error) {
	if len(flags) == 0 {
		return false, nil
	}
	for _, fl := range flags[1:] {
		if fl.expert != flags[0].expert {
			return false, fmt.Errorf("%s: optimizer[%d] mixes dense and expert param groups in one distributed optimizer, which ucp does not read", path, i)
		}
	}
	return flags[0].expert, nil
}

func (f *rankFile) mapEntry(a *Args, path string, i int, ds *distState, expert bool) error {
	// The dtype key kind decides the grouping.
	byGrad := false
	for _, gd := range ds.gbufs {
		for n := 0; n < gd.Len(); n++ {
			k, _ := gd.Item(n)
			if _, _, single, ok := dtypeKey(k); ok && single {
				byGrad = true
			}
		}
	}
	bufs := f.buffers(a, expert, byGrad)
	if len(bufs) != len(ds.gbufs) {
		return fmt.Errorf("%s: entry %d holds %d buffers but the %s parameters of %s form %d (per chunk and dtype)",
			path, i, len(ds.gbufs), map[bool]string{true: "expert", false: "dense"}[expert], f.rd.model, len(bufs))
	}
	for gi, b := range bufs {
		gd, ok := ds.gbufs[int64(gi)]
		if !ok {
			return fmt.Errorf("%s: entry %d has no buffer %d", path, i, gi)
		}
		if gd.Len() != 1 {
			return fmt.Errorf("%s: entry %d buffer %d has %d dtype keys; one was expected", path, i, gi, gd.Len())
		}
		k, v := gd.Item(0)
		pd, gdt, _, ok := dtypeKey(k)
		if !ok || pd != b.param || gdt != b.grad {
			return fmt.Errorf("%s: entry %d buffer %d has dtype key %s but chunk %d's parameters give (%v, %v)", path, i, gi, pyobj.Repr(k), b.chunk, b.param, b.grad)
		}
		where := fmt.Sprintf("%s: entry %d buffer %d (chunk %d)", path, i, gi, b.chunk)
		sd := pyobj.NewDec(where, v)
		st := sd.AsDict()
		if err := sd.Err(); err != nil {
			return err
		}
		if ds.coalesced {
			err := f.mapCoalesced(where, a, b, st, expert)
			if err != nil {
				return err
			}
			continue
		}
		if err := f.mapBuckets(where, a, b, st, ds, gi, expert); err != nil {
			return err
		}
	}
	return nil
}

func layoutParams(b *buffer) []layoutParam {
	out := make([]layoutParam, len(b.params))
	for i, lp := range b.params {
		out[i] = layoutParam{numel: lp.t.Numel(), shared: lp.shared}
	}
	return out
}

// stateTensors returns the per-state values of a buffer state dict,
// 'param' renamed fp32; a key that is not a string is an error.
func stateTensors(where string, st *pyobj.Dict) (map[string]pyobj.Value, error) {
	out := map[string]pyobj.Value{}
	sd := pyobj.NewDec(where, st)
	for _, it := range sd.Items() {
		ks := it.Key
		if ks == "" || ks == "numel_unpadded" {
			continue
		}
		if ks == "param" {
			ks = fragment.FP32
		}
		out[ks] = it.Value()
	}
	return out, sd.Err()
}

// mapCoalesced reads an F3 buffer (core >= 0.7): one flat tensor per state
// holding the buckets without their end padding. The version is told by
// numel_unpadded: with 64-element alignment, or without.
func (f *rankFile) mapCoalesced(where string, a *Args, b *buffer, st *pyobj.Dict, expert bool) error {
	sd := pyobj.NewDec(where, st)
	nu := sd.Int("numel_unpadded")
	if err := sd.Err(); err != nil {
		return err
	}
	lps := layoutParams(b)
	var lay layoutResult
	found := false
	var tried []string
	for _, r := range []layoutRules{rulesHead, rules07} {
		lay = computeLayout(lps, b.bucketSize, r)
		var sum int64
		for _, u := range lay.unpadded {
			sum += u
		}
		if sum == nu {
			found = true
			break
		}
		tried = append(tried, fmt.Sprintf("%s gives %d", r.name, sum))
	}
	if !found {
		return fmt.Errorf("%s: numel_unpadded is %d, but no known bucket layout of its %d parameters gives that (%s, bucket size %d)",
			where, nu, len(b.params), strings.Join(tried, "; "), b.bucketSize)
	}
	base := make([]int64, len(lay.unpadded)+1)
	for i, u := range lay.unpadded {
		base[i+1] = base[i] + u
	}
	tensors := map[string]*torchfile.Tensor{}
	states, err := stateTensors(where, st)
	if err != nil {
		return err
	}
	for name, v := range states {
		td := pyobj.NewDec(fmt.Sprintf("%s: state %q", where, name), v)
		t := pyobj.As[*torchfile.Tensor](td, "tensor")
		if err := td.Err(); err != nil {
			return err
		}
		if t.Numel() != nu || len(t.Shape) != 1 {
			return fmt.Errorf("%s: state %q has shape %v but numel_unpadded is %d", where, name, t.Shape, nu)
		}
		tensors[name] = t
	}
	if tensors[fragment.FP32] == nil {
		return fmt.Errorf("%s: no 'param' (fp32 main parameters)", where)
	}
	for i, lp := range b.params {
		off := base[lay.bucket[i]] + lay.start[i]
		lp.states = map[string]srcRef{}
		for name, t := range tensors {
			lp.states[name] = srcRef{ref: fragment.Ref(f.rd.distrib, t, 0), start: off}
		}
	}
	return nil
}

// mapBuckets reads an F2 (core 0.6) or F1 (core <= 0.5) buffer: one
// padded tensor per bucket and state (or a single tensor).
func (f *rankFile) mapBuckets(where string, a *Args, b *buffer, st *pyobj.Dict, ds *distState, gi int, expert bool) error {
	per := map[string][]*torchfile.Tensor{}
	nb := -1
	states, err := stateTensors(where, st)
	if err != nil {
		return err
	}
	for name, v := range states {
		var ts []*torchfile.Tensor
		switch x := v.(type) {
		case *torchfile.Tensor:
			ts = []*torchfile.Tensor{x}
		case *pyobj.List:
			ld := pyobj.NewDec(fmt.Sprintf("%s: state %q buckets", where, name), x)
			for _, it := range ld.AsList() {
				ts = append(ts, pyobj.As[*torchfile.Tensor](it, "tensor"))
			}
			if err := ld.Err(); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: state %q is %s, neither a tensor nor a list of bucket tensors", where, name, pyobj.TypeName(v))
		}
		if nb >= 0 && len(ts) != nb {
			return fmt.Errorf("%s: states hold different bucket counts", where)
		}
		nb = len(ts)
		per[name] = ts
	}
	if per[fragment.FP32] == nil {
		return fmt.Errorf("%s: no 'param' (fp32 main parameters)", where)
	}
	wantUnpadded, err := bucketList(where, "per_bucket_numel_unpadded", ds.unpadded, gi)
	if err != nil {
		return err
	}
	wantPadded, err := bucketList(where, "per_bucket_numel", ds.perBucket, gi)
	if err != nil {
		return err
	}
	D := a.denseDP()
	if expert {
		D = a.expertDP()
	}
	lps := layoutParams(b)
	var lay layoutResult
	found := false
	var tried []string
	for _, r := range []layoutRules{rules06, rules05} {
		bs := b.bucketSize
		if nb == 1 && len(per[fragment.FP32]) == 1 {
			switch states[fragment.FP32].(type) {
			case *torchfile.Tensor:
				bs = 0 // a bare tensor: the whole buffer, no buckets
			}
		}
		lay = computeLayout(lps, bs, r)
		why := layoutMismatch(lay, per[fragment.FP32], wantUnpadded, wantPadded, D)
		if why == "" {
			found = true
			break
		}
		tried = append(tried, r.name+": "+why)
	}
	if !found {
		return fmt.Errorf("%s: no known bucket layout fits (%s)", where, strings.Join(tried, "; "))
	}
	for i, lp := range b.params {
		bk := lay.bucket[i]
		lp.states = map[string]srcRef{}
		for name, ts := range per {
			t := ts[bk]
			if lay.start[i]+lp.t.Numel() > t.Numel() {
				return fmt.Errorf("%s: %s needs elements [%d,%d) of bucket %d's %q, which has %d", where, lp.local, lay.start[i], lay.start[i]+lp.t.Numel(), bk, name, t.Numel())
			}
			lp.states[name] = srcRef{ref: fragment.Ref(f.rd.distrib, t, 0), start: lay.start[i]}
		}
	}
	return nil
}

// bucketList reads per_bucket_numel[gi]'s single dtype entry, or nil when
// the list has none; key names the list in errors.
func bucketList(where, key string, l *pyobj.List, gi int) ([]int64, error) {
	if l == nil || gi >= len(l.Items) {
		return nil, nil
	}
	e := pyobj.NewDec(where+": "+key, l).Index(gi)
	d := e.AsDict()
	if d != nil && d.Len() != 1 {
		e.Failf("has %d dtype keys, want 1", d.Len())
	}
	var sizes []int64
	if d != nil && d.Len() == 1 {
		k, _ := d.Item(0)
		sizes = e.Key(k).AsInts()
	}
	return sizes, e.Err()
}

// layoutMismatch checks a computed layout against the bucket tensors and
// the recorded bucket sizes; "" when it fits.
func layoutMismatch(lay layoutResult, tensors []*torchfile.Tensor, unpadded, padded []int64, D int) string {
	if len(lay.unpadded) != len(tensors) {
		return fmt.Sprintf("%d buckets, the file has %d", len(lay.unpadded), len(tensors))
	}
	for b, u := range lay.unpadded {
		n := tensors[b].Numel()
		if n < u {
			return fmt.Sprintf("bucket %d needs %d elements, the file has %d", b, u, n)
		}
		if unpadded != nil && (b >= len(unpadded) || unpadded[b] != u) {
			return fmt.Sprintf("bucket %d holds %d elements, per_bucket_numel_unpadded says %v", b, u, unpadded)
		}
		if padded != nil && (b >= len(padded) || padded[b] != n) {
			return fmt.Sprintf("bucket %d tensor has %d elements, per_bucket_numel says %v", b, n, padded)
		}
		if D > 0 && n != pad(u, int64(D)) {
			return fmt.Sprintf("bucket %d of %d elements padded to %d, not to a multiple of data parallel %d", b, u, n, D)
		}
	}
	return ""
}
