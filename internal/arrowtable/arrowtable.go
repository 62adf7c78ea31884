// Package arrowtable writes a checkpoint's fragment table and its
// conversion plan as Apache Arrow IPC files (ucp inspect --arrow, ucp
// convert --dry-run --arrow), so that a checkpoint of thousands of files
// can be queried in pandas, polars or DuckDB. FORMAT.md describes the
// columns.
package arrowtable

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/apache/arrow/go/v17/arrow"
	"github.com/apache/arrow/go/v17/arrow/array"
	"github.com/apache/arrow/go/v17/arrow/ipc"
	"github.com/apache/arrow/go/v17/arrow/memory"

	"github.com/ucp-project/ucp/internal/fragment"
	"github.com/ucp-project/ucp/internal/mapreduce"
)

// BatchRows bounds the rows of one record batch, so memory stays bounded
// however large the table.
const BatchRows = 1 << 16

// PlanPath is where Write puts the plan next to the fragment file path:
// x.arrow -> x.plan.arrow, x -> x.plan.arrow.
func PlanPath(path string) string {
	return strings.TrimSuffix(path, ".arrow") + ".plan.arrow"
}

// Write writes the fragment table to path and the plan to PlanPath(path),
// and returns their row counts. Both are written under temporary names and
// renamed when both are complete, so a failed or interrupted write leaves
// no file that looks whole.
func Write(path string, t *fragment.Table, p *mapreduce.Plan) (fragments, tasks int, err error) {
	if strings.HasSuffix(path, ".plan.arrow") {
		return 0, 0, fmt.Errorf("%s: name the fragment file; its plan goes next to it as NAME.plan.arrow", path)
	}
	for _, q := range t.Params {
		for _, st := range q.States {
			fragments += len(st.Frags)
		}
	}
	ftmp, err := writeTemp(path, func(f *os.File) error { return Fragments(f, t) })
	if err != nil {
		return 0, 0, err
	}
	defer os.Remove(ftmp) // gone after the rename; removes it after a failure
	ptmp, err := writeTemp(PlanPath(path), func(f *os.File) error { return Plan(f, t, p) })
	if err != nil {
		return 0, 0, err
	}
	defer os.Remove(ptmp)
	if err := os.Rename(ftmp, path); err != nil {
		return 0, 0, err
	}
	if err := os.Rename(ptmp, PlanPath(path)); err != nil {
		os.Remove(path) // not without its plan
		return 0, 0, err
	}
	return fragments, len(p.Tasks), nil
}

// writeTemp writes a file next to path under a temporary name and returns
// that name.
func writeTemp(path string, write func(*os.File) error) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".partial-*")
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	err = f.Chmod(0o644)
	if err == nil {
		err = write(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return f.Name(), nil
}

var (
	i64s  = arrow.ListOf(arrow.PrimitiveTypes.Int64)
	boxes = arrow.ListOf(i64s)
)

// FragmentFields are the columns of the fragment file, one row per
// fragment, in the table's order (parameter, state, fragment).
var FragmentFields = []arrow.Field{
	{Name: "param", Type: arrow.BinaryTypes.String},
	{Name: "state", Type: arrow.BinaryTypes.String},
	{Name: "pattern", Type: arrow.BinaryTypes.String},
	{Name: "param_shape", Type: i64s},
	{Name: "file", Type: arrow.BinaryTypes.String},
	{Name: "byte_offset", Type: arrow.PrimitiveTypes.Int64},
	{Name: "bytes", Type: arrow.PrimitiveTypes.Int64},
	{Name: "contiguous", Type: arrow.FixedWidthTypes.Boolean},
	{Name: "dtype", Type: arrow.BinaryTypes.String},
	{Name: "elements", Type: arrow.PrimitiveTypes.Int64},
	{Name: "src_start", Type: arrow.PrimitiveTypes.Int64},
	{Name: "shard", Type: arrow.PrimitiveTypes.Int32},
	{Name: "shard_label", Type: arrow.BinaryTypes.String},
	{Name: "shard_shape", Type: i64s},
	{Name: "shard_start", Type: arrow.PrimitiveTypes.Int64},
	{Name: "flat_start", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
	{Name: "flat_end", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
	{Name: "box_offsets", Type: boxes, Nullable: true},
	{Name: "box_lengths", Type: boxes, Nullable: true},
	{Name: "box_shard_offsets", Type: boxes, Nullable: true},
	{Name: "replica", Type: arrow.PrimitiveTypes.Int32},
}

// metadata names the table and its source in the schema.
func metadata(kind string, t *fragment.Table) *arrow.Metadata {
	deg, _ := json.Marshal(t.Degrees)
	md := arrow.NewMetadata([]string{"ucp.table", "ucp.format", "ucp.source", "ucp.tag", "ucp.degrees"},
		[]string{kind, t.Format, t.Source, t.Tag, string(deg)})
	return &md
}

// batches builds records of at most BatchRows rows and writes them.
type batches struct {
	b    *array.RecordBuilder
	w    *ipc.FileWriter
	rows int
}

func newBatches(w io.WriteSeeker, fields []arrow.Field, md *arrow.Metadata) (*batches, error) {
	schema := arrow.NewSchema(fields, md)
	fw, err := ipc.NewFileWriter(w, ipc.WithSchema(schema), ipc.WithAllocator(memory.DefaultAllocator))
	if err != nil {
		return nil, err
	}
	return &batches{b: array.NewRecordBuilder(memory.DefaultAllocator, schema), w: fw}, nil
}

// row counts a finished row and flushes a full batch.
func (bs *batches) row() error {
	bs.rows++
	if bs.rows < BatchRows {
		return nil
	}
	return bs.flush()
}

func (bs *batches) flush() error {
	if bs.rows == 0 {
		return nil
	}
	rec := bs.b.NewRecord()
	defer rec.Release()
	bs.rows = 0
	return bs.w.Write(rec)
}

// close writes the last batch (an empty one when there were no rows, so
// readers see the schema with zero rows) and the file footer.
func (bs *batches) close(n int) error {
	defer bs.b.Release()
	var err error
	if n == 0 {
		rec := bs.b.NewRecord()
		err = bs.w.Write(rec)
		rec.Release()
	} else {
		err = bs.flush()
	}
	if cerr := bs.w.Close(); err == nil {
		err = cerr
	}
	return err
}

func str(b *array.RecordBuilder, i int, s string) { b.Field(i).(*array.StringBuilder).Append(s) }
func i64(b *array.RecordBuilder, i int, v int64)  { b.Field(i).(*array.Int64Builder).Append(v) }
func i32(b *array.RecordBuilder, i int, v int)    { b.Field(i).(*array.Int32Builder).Append(int32(v)) }

func list(b *array.RecordBuilder, i int, v []int64) {
	lb := b.Field(i).(*array.ListBuilder)
	lb.Append(true)
	lb.ValueBuilder().(*array.Int64Builder).AppendValues(v, nil)
}

// boxList appends one box vector per map (the field pick chooses), or
// null when the shard is the full tensor.
func boxList(b *array.RecordBuilder, i int, maps []fragment.BoxMap, pick func(fragment.BoxMap) []int64) {
	lb := b.Field(i).(*array.ListBuilder)
	if maps == nil {
		lb.AppendNull()
		return
	}
	lb.Append(true)
	inner := lb.ValueBuilder().(*array.ListBuilder)
	for _, m := range maps {
		inner.Append(true)
		inner.ValueBuilder().(*array.Int64Builder).AppendValues(pick(m), nil)
	}
}

// Fragments writes the fragment table as an Arrow IPC file.
func Fragments(w io.WriteSeeker, t *fragment.Table) error {
	bs, err := newBatches(w, FragmentFields, metadata("fragments", t))
	if err != nil {
		return err
	}
	b, n := bs.b, 0
	for _, p := range t.Params {
		kind, _ := fragment.Classify(p)
		for _, st := range p.States {
			for _, f := range st.Frags {
				if f.Shard < 0 || f.Shard >= len(st.Shards) {
					bs.close(n)
					return fmt.Errorf("parameter %s, state %s: fragment of shard %d of %d", p.Name, st.Name, f.Shard, len(st.Shards))
				}
				sh := &st.Shards[f.Shard]
				off, contiguous := byteOffset(f)
				str(b, 0, p.Name)
				str(b, 1, st.Name)
				str(b, 2, kind.String())
				list(b, 3, p.Shape)
				str(b, 4, f.Src.Path)
				i64(b, 5, off)
				i64(b, 6, f.Len*int64(f.Src.DType().Size()))
				b.Field(7).(*array.BooleanBuilder).Append(contiguous)
				str(b, 8, f.Src.DType().String())
				i64(b, 9, f.Len)
				i64(b, 10, f.SrcStart)
				i32(b, 11, f.Shard)
				str(b, 12, sh.Label)
				list(b, 13, sh.Shape)
				i64(b, 14, f.LocalStart)
				if sh.Maps == nil {
					i64(b, 15, f.LocalStart)
					i64(b, 16, f.LocalStart+f.Len)
				} else {
					b.Field(15).AppendNull()
					b.Field(16).AppendNull()
				}
				boxList(b, 17, sh.Maps, func(m fragment.BoxMap) []int64 { return m.To })
				boxList(b, 18, sh.Maps, func(m fragment.BoxMap) []int64 { return m.Size })
				boxList(b, 19, sh.Maps, func(m fragment.BoxMap) []int64 { return m.From })
				i32(b, 20, sh.Replica)
				n++
				if err := bs.row(); err != nil {
					bs.close(n)
					return err
				}
			}
		}
	}
	return bs.close(n)
}

// byteOffset is the file offset of the fragment's first element, and
// whether its elements are one contiguous run of the file from there.
func byteOffset(f fragment.Fragment) (int64, bool) {
	x := f.Src.T
	elem := x.StorageOffset
	rest := f.SrcStart
	for d := len(x.Shape) - 1; d >= 0; d-- {
		if x.Shape[d] == 0 {
			break
		}
		elem += rest % x.Shape[d] * x.Stride[d]
		rest /= x.Shape[d]
	}
	return x.Storage.Offset + elem*int64(x.DType.Size()), x.IsContiguous()
}

// PlanFields are the columns of the plan file, one row per task in the
// plan's order.
var PlanFields = []arrow.Field{
	{Name: "task", Type: arrow.PrimitiveTypes.Int32},
	{Name: "node", Type: arrow.PrimitiveTypes.Int32},
	{Name: "worker", Type: arrow.PrimitiveTypes.Int32},
	{Name: "kind", Type: arrow.BinaryTypes.String},
	{Name: "output", Type: arrow.BinaryTypes.String},
	{Name: "param", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "state", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "start", Type: arrow.PrimitiveTypes.Int64},
	{Name: "end", Type: arrow.PrimitiveTypes.Int64},
	{Name: "chunk", Type: arrow.PrimitiveTypes.Int32},
	{Name: "of", Type: arrow.PrimitiveTypes.Int32},
	{Name: "bytes", Type: arrow.PrimitiveTypes.Int64},
}

// taskKinds names the plan's task kinds in the kind column.
var taskKinds = map[mapreduce.TaskKind]string{mapreduce.ReduceTask: "state", mapreduce.StepTask: "step", mapreduce.CopyTask: "copy", mapreduce.ValueTask: "value"}

// Plan writes the plan's tasks as an Arrow IPC file. The worker is the
// one Plan.WorkerShares expects to run the task (workers pull tasks, so a
// run may differ).
func Plan(w io.WriteSeeker, t *fragment.Table, p *mapreduce.Plan) error {
	md := metadata("plan", t)
	md2 := arrow.NewMetadata(append(md.Keys(), "ucp.plan", "ucp.nodes", "ucp.workers", "ucp.chunk_elems"),
		append(md.Values(), p.ID(), fmt.Sprint(p.Nodes), fmt.Sprint(p.Cores), fmt.Sprint(p.ChunkElems)))
	bs, err := newBatches(w, PlanFields, &md2)
	if err != nil {
		return err
	}
	worker := map[mapreduce.Task]int{}
	for n := 0; n < p.Nodes; n++ {
		for wi, share := range p.WorkerShares(n) {
			for _, tk := range share {
				worker[tk] = wi
			}
		}
	}
	b := bs.b
	for i, tk := range p.Tasks {
		if tk.Output < 0 || tk.Output >= len(p.Outputs) {
			bs.close(i)
			return fmt.Errorf("plan task %d writes output %d of %d", i, tk.Output, len(p.Outputs))
		}
		o := &p.Outputs[tk.Output]
		i32(b, 0, i)
		i32(b, 1, tk.Node)
		i32(b, 2, worker[tk])
		str(b, 3, taskKinds[tk.Kind])
		str(b, 4, filepath.ToSlash(o.Path))
		if o.Param >= 0 && o.Param < len(t.Params) {
			str(b, 5, t.Params[o.Param].Name)
		} else {
			b.Field(5).AppendNull()
		}
		if o.Name != "" {
			str(b, 6, o.Name)
		} else {
			b.Field(6).AppendNull()
		}
		i64(b, 7, tk.Start)
		i64(b, 8, tk.End)
		i32(b, 9, tk.Chunk)
		i32(b, 10, tk.Of)
		i64(b, 11, tk.Bytes)
		if err := bs.row(); err != nil {
			bs.close(i + 1)
			return err
		}
	}
	return bs.close(len(p.Tasks))
}
