package atomic

import (
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/family"
	"github.com/ucp-project/ucp/internal/fsutil"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// ReaderOptions configure OpenReader.
type ReaderOptions struct {
	// Verify checks every file's size and CRC-32 against the manifest
	// before its first use (one sequential read of the file), or from
	// the bytes read and copied (VerifyingReads): every byte copied from
	// a state file is then read back and hashed. Without it a copy in the
	// kernel takes its CRC from the manifest's block CRC-32s where there
	// are some, and those bytes are never read (State.Blocks).
	Verify bool
	// Limits bound the walk over loaded values (zero: pyobj.DefaultLimits).
	Limits pyobj.Limits
}

// Reader reads an atomic checkpoint through its manifest: the parameters
// and their states, each state's float32 elements by range (lazily, one
// ranged read per call), the steps and the global files.
type Reader struct {
	Dir      string
	Manifest *Manifest
	opt      ReaderOptions

	root     string               // Dir with its symbolic links resolved
	files    map[string]FileEntry // relative path -> manifest entry
	params   map[string]int
	mu       sync.Mutex
	verified map[string]error
	// tracks, inside VerifyingReads, holds each state file opened with
	// the ranges read of it.
	tracks map[string]*readTrack
	blocks map[string]blockCheck // state files' block CRC-32s, checked once
}

// blockCheck is a state file's block CRC-32s decoded and checked against
// its record's CRC-32, or why they cannot be used.
type blockCheck struct {
	crcs []uint32
	err  error
}

// OpenReader reads DIR/ucp.json and checks that every file it lists lies
// inside DIR.
func OpenReader(dir string, opt ReaderOptions) (*Reader, error) {
	m, err := ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, err
	}
	return newReader(dir, root, m, opt)
}

// newReader indexes a parsed manifest: parameters listed once, every file
// path inside the checkpoint.
func newReader(dir, root string, m *Manifest, opt ReaderOptions) (*Reader, error) {
	r := &Reader{Dir: dir, Manifest: m, opt: opt, root: root, files: map[string]FileEntry{}, params: map[string]int{},
		verified: map[string]error{}}
	add := func(e FileEntry) error {
		if err := CheckPath(dir, e.Path); err != nil {
			return err
		}
		r.files[e.Path] = e
		return nil
	}
	for i, p := range m.Params {
		if _, dup := r.params[p.Name]; dup {
			return nil, fmt.Errorf("%s: parameter %s is listed twice", filepath.Join(dir, ManifestName), p.Name)
		}
		r.params[p.Name] = i
	}
	for _, f := range m.AllFiles() {
		if err := add(f); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// CheckPath refuses a manifest path that could name a file outside the
// checkpoint DIR: empty, absolute, with '..' or a backslash.
func CheckPath(dir, rel string) error {
	p := filepath.FromSlash(rel)
	if rel == "" || filepath.IsAbs(p) || strings.Contains(rel, "..") || strings.Contains(rel, "\\") {
		return fmt.Errorf("%s: manifest lists the file %q outside the checkpoint", filepath.Join(dir, ManifestName), rel)
	}
	return nil
}

// Params returns the parameters in manifest order.
func (r *Reader) Params() []ParamEntry { return r.Manifest.Params }

// Param returns the manifest entry of a parameter.
func (r *Reader) Param(name string) (*ParamEntry, bool) {
	i, ok := r.params[name]
	if !ok {
		return nil, false
	}
	return &r.Manifest.Params[i], true
}

// HasFile reports whether the manifest lists a global file (OptimizerState
// as "zero/optimizer_state.pt", ExtraState, ...).
func (r *Reader) HasFile(rel string) bool {
	_, ok := r.files[filepath.ToSlash(rel)]
	return ok
}

// stateEntry finds the file of one state of a parameter.
func (r *Reader) stateEntry(param, state string) (FileEntry, error) {
	p, ok := r.Param(param)
	if !ok {
		return FileEntry{}, fmt.Errorf("%s: no parameter %s", r.Dir, param)
	}
	for _, s := range p.Files {
		if s.State == state {
			return s.FileEntry, nil
		}
	}
	return FileEntry{}, fmt.Errorf("%s: parameter %s has no state %s", r.Dir, param, state)
}

// Inside refuses a file of the checkpoint that is a symbolic link (or lies
// under one) resolving outside the checkpoint folder: the manifest's CRCs
// vouch for files of the checkpoint, not for whatever a link points at.
func (r *Reader) Inside(path string) error {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	if rel, err := filepath.Rel(r.root, real); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return fmt.Errorf("%s: a symbolic link to %s, outside the checkpoint %s: refusing to read it", path, real, r.Dir)
	}
	return nil
}

// verify checks a file against its manifest entry once, when asked to.
func (r *Reader) verify(e FileEntry) error {
	if err := r.Inside(filepath.Join(r.Dir, filepath.FromSlash(e.Path))); err != nil {
		return err
	}
	if !r.opt.Verify {
		return nil
	}
	r.mu.Lock()
	err, done := r.verified[e.Path]
	r.mu.Unlock()
	if done {
		return err
	}
	err = VerifyFile(filepath.Join(r.Dir, filepath.FromSlash(e.Path)), e)
	r.mu.Lock()
	r.verified[e.Path] = err
	r.mu.Unlock()
	return err
}

// VerifyFile checks the size and CRC-32 of a file against its entry.
func VerifyFile(path string, e FileEntry) error {
	f, err := fsutil.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := newCRC()
	// 256 KiB reads: 8x fewer system calls than io.Copy's 32 KiB, and the
	// buffer stays in the CPU's cache between the read and the CRC.
	n, err := io.CopyBuffer(h, struct{ io.Reader }{f}, make([]byte, 256<<10))
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if n != e.Bytes {
		return fmt.Errorf("%s: %d bytes, but the manifest says %d", path, n, e.Bytes)
	}
	if got := fmt.Sprintf("%08x", h.Sum32()); got != strings.ToLower(e.CRC32) {
		return fmt.Errorf("%s: CRC-32 %s, but the manifest says %s (the file changed or is corrupt)", path, got, e.CRC32)
	}
	return nil
}

// Verify checks every file of the manifest.
func (r *Reader) Verify() error {
	for _, e := range r.files {
		if err := VerifyFile(filepath.Join(r.Dir, filepath.FromSlash(e.Path)), e); err != nil {
			return err
		}
	}
	return nil
}

// State is one opened state file: a tensor of the parameter's shape, in
// the manifest's dtype (float32, or a frozen parameter's or buffer's own).
type State struct {
	Param, Name string
	Shape       []int64
	DType       dtype.DType
	Path        string
	f           *torchfile.File
	t           *torchfile.Tensor
	track       *readTrack // deferred verification: the ranges read are hashed into it
	blocks      *fsutil.BlockCRCs
}

// OpenState opens zero/<param>/<state>.pt and checks that its 'param'
// tensor has the manifest's dtype and shape. Close it when done.
func (r *Reader) OpenState(param, state string) (*State, error) {
	if state == StepState {
		return nil, fmt.Errorf("%s: the step is not a tensor state; use Step", param)
	}
	e, err := r.stateEntry(param, state)
	if err != nil {
		return nil, err
	}
	track, err := r.trackOrVerify(e)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(r.Dir, filepath.FromSlash(e.Path))
	p, _ := r.Param(param)
	f, t, err := OpenStateFile(path, p)
	if err != nil {
		return nil, err
	}
	want, _ := p.StateDType()
	s := &State{Param: param, Name: state, Shape: append([]int64{}, p.Shape...), DType: want, Path: path, f: f, t: t, track: track}
	if e.Blocks != "" && !r.opt.Verify {
		if s.blocks, err = r.stateBlocks(e, s); err != nil {
			f.Close()
			return nil, err
		}
	}
	return s, nil
}

// stateBlocks returns the block CRC-32s of an opened state's tensor data
// (nil when it is not read from a file), checked once per file: their
// count must fit the data and they must combine to the record's CRC-32 in
// the file's central directory, which the file's manifest CRC-32 covers.
// That proves they belong to the file as it is, not that its data bytes
// are intact: copies made from them do not read those bytes (FORMAT.md,
// "block_crc32").
func (r *Reader) stateBlocks(e FileEntry, s *State) (*fsutil.BlockCRCs, error) {
	f, start := s.File()
	if f == nil {
		return nil, nil
	}
	r.mu.Lock()
	c, done := r.blocks[e.Path]
	r.mu.Unlock()
	b := &fsutil.BlockCRCs{File: f, Start: start, Len: s.t.NBytes(), Size: BlockSize, CRCs: c.crcs}
	if !done {
		b.CRCs, c.err = decodeBlocks(e.Blocks)
		if c.err == nil {
			c.err = b.Check(s.t.Storage.CRC32)
		} else {
			c.err = fmt.Errorf("%s: %w", s.Path, c.err)
		}
		c.crcs = b.CRCs
		r.mu.Lock()
		if r.blocks == nil {
			r.blocks = map[string]blockCheck{}
		}
		r.blocks[e.Path] = c
		r.mu.Unlock()
	}
	if c.err != nil {
		return nil, fmt.Errorf("refusing the manifest's block CRC-32s: %w", c.err)
	}
	return b, nil
}

// Blocks returns the block CRC-32s of the state's tensor data for a
// Copier (fsutil.Copier.Blocks): its copies take their CRC from them
// instead of reading the bytes back. Nil when the manifest has none
// (checkpoints written before them) or with ReaderOptions.Verify, which
// must read every byte it vouches for: torch.load does not check CRCs
// (FORMAT.md, "block_crc32"), so only a read catches a corrupt byte
// before DeepSpeed or torch loads it.
func (s *State) Blocks() *fsutil.BlockCRCs { return s.blocks }

// OpenStateFile opens the state file path of parameter p and checks its
// header against the manifest: a 'param' tensor (or a bare tensor) of the
// manifest's dtype and shape, laid out contiguously from the start of a
// storage of exactly its size (ucp writes no padding and no views). Only
// the header is read; a file whose header disagrees is refused before any
// element is trusted.
func OpenStateFile(path string, p *ParamEntry) (*torchfile.File, *torchfile.Tensor, error) {
	want, err := p.StateDType()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	f, err := torchfile.Open(path)
	if err != nil {
		return nil, nil, err
	}
	t, err := StateTensor(f.Root)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := checkHeader(t, want, p.Shape); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, t, nil
}

// StateTensor returns the tensor of a state file: the 'param' of
// DeepSpeed's universal dict, or the file's bare tensor.
func StateTensor(root pyobj.Value) (*torchfile.Tensor, error) {
	switch x := root.(type) {
	case *torchfile.Tensor:
		return x, nil
	case *pyobj.Dict:
		d := pyobj.NewDec("", x)
		t := pyobj.As[*torchfile.Tensor](d.Key("param"), "tensor")
		return t, d.Err()
	}
	return nil, fmt.Errorf("holds a %s, want a tensor or a dict with 'param'", pyobj.TypeName(root))
}

func checkHeader(t *torchfile.Tensor, want dtype.DType, shape []int64) error {
	if t.DType != want || !torchfile.SameShape(t.Shape, shape) {
		return fmt.Errorf("'param' is %v%v, but the manifest says %v%v", t.DType, t.Shape, want, shape)
	}
	if t.Storage == nil || t.Storage.DType.Size() == 0 {
		return fmt.Errorf("'param' has no storage")
	}
	if t.StorageOffset != 0 || t.Storage.NBytes() != t.NBytes() || !contiguous(t) {
		return fmt.Errorf("'param' is a view (offset %d, strides %v) of a storage of %d bytes, not the %d contiguous bytes of %v%v ucp writes",
			t.StorageOffset, t.Stride, t.Storage.NBytes(), t.NBytes(), want, shape)
	}
	return nil
}

// contiguous reports whether t's strides are the row-major ones of its
// shape (dims of size 1 may have any stride).
func contiguous(t *torchfile.Tensor) bool {
	if len(t.Stride) != len(t.Shape) {
		return false
	}
	want := int64(1)
	for d := len(t.Shape) - 1; d >= 0; d-- {
		if t.Shape[d] != 1 && t.Stride[d] != want {
			return false
		}
		want *= t.Shape[d]
	}
	return true
}

// Numel returns the number of elements.
func (s *State) Numel() int64 { return s.t.Numel() }

// ReadRange reads elements [start, start+n) as little-endian bytes of
// s.DType into dst (n·size bytes) with one ranged read.
func (s *State) ReadRange(start, n int64, dst []byte) error {
	if err := s.f.ReadRange(s.t, start, n, dst); err != nil {
		return fmt.Errorf("%s: %w", s.Path, err)
	}
	if s.track != nil {
		es := int64(s.t.DType.Size())
		s.track.add(s.t.FileOffset()+start*es, n*es, crc32.ChecksumIEEE(dst[:n*es]))
	}
	return nil
}

// Record counts n bytes of the state's elements from element start, whose
// CRC-32 is crc, as read for deferred verification: a copy made in the
// kernel (fsutil.Copier.Last) instead of ReadRange. A no-op otherwise.
func (s *State) Record(start, n int64, crc uint32) {
	if s.track != nil {
		es := int64(s.t.DType.Size())
		s.track.add(s.t.FileOffset()+start*es, n*es, crc)
	}
}

// ReadFloat32 reads elements [start, start+n) converted to float32.
func (s *State) ReadFloat32(start, n int64) ([]float32, error) {
	if s.track != nil { // the bytes read must be hashed: read them here
		raw := make([]byte, n*int64(s.t.DType.Size()))
		if err := s.ReadRange(start, n, raw); err != nil {
			return nil, err
		}
		out := make([]byte, 4*n)
		if err := dtype.ToFloat32(out, raw, s.t.DType); err != nil {
			return nil, fmt.Errorf("%s: %w", s.Path, err)
		}
		return dtype.Float32s(out), nil
	}
	v, err := s.f.ReadFloat32(s.t, start, n)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Path, err)
	}
	return v, nil
}

// File returns the open file that holds the state's elements and the byte
// offset of its first element (they are stored contiguously), for copies
// in the kernel; nil when the state is not read from a file.
func (s *State) File() (*os.File, int64) {
	if f, ok := s.f.ReaderAt().(*os.File); ok {
		return f, s.t.FileOffset()
	}
	return nil, 0
}

// Close closes the file.
func (s *State) Close() error { return s.f.Close() }

// maxLoaded bounds a global file or step decoded with its tensors in memory.
const maxLoaded = 1 << 30

// Step returns the decoded step.pt of a parameter: a Python int or float,
// or a *torchfile.Blob holding a 0-dim tensor's bytes; ok is false when
// the parameter has no step.
func (r *Reader) Step(param string) (v pyobj.Value, ok bool, err error) {
	e, err := r.stateEntry(param, StepState)
	if err != nil {
		if _, has := r.Param(param); has {
			return nil, false, nil
		}
		return nil, false, err
	}
	v, err = r.load(e)
	return v, err == nil, err
}

// Load decodes a global file listed in the manifest (OptimizerState under
// zero/, ExtraState): its value with every tensor as a *torchfile.Blob
// holding its bytes.
func (r *Reader) Load(rel string) (pyobj.Value, error) {
	e, ok := r.files[filepath.ToSlash(rel)]
	if !ok {
		return nil, fmt.Errorf("%s: the manifest lists no %s", r.Dir, rel)
	}
	return r.load(e)
}

func (r *Reader) load(e FileEntry) (pyobj.Value, error) {
	if err := r.verify(e); err != nil {
		return nil, err
	}
	path := filepath.Join(r.Dir, filepath.FromSlash(e.Path))
	f, err := torchfile.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	v, err := f.WithBytes(f.Root, r.opt.Limits, maxLoaded)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// Model returns the model family and config: the manifest's source.model,
// else the one the recorded training arguments give (family.Detect; for
// manifests written before ucp recorded it, and tables indexed outside
// formats.Index). It errs when neither tells one, saying why.
func (r *Reader) Model() (*family.Config, error) {
	if m := r.Manifest.Source.Model; m != nil {
		c := *m
		return &c, nil
	}
	args := r.Manifest.Source.Args
	if args == nil {
		return nil, fmt.Errorf("%s records no model family or training arguments (a %s source)", r.Dir, r.Manifest.Source.Format)
	}
	var ps []family.Param
	for _, p := range r.Manifest.Params {
		ps = append(ps, family.Param{Name: p.Name, Shape: p.Shape})
	}
	c, err := family.Detect(args, ps, r.Manifest.Source.Format)
	if err != nil {
		return nil, fmt.Errorf("%s: the model is none of the known families: %w", r.Dir, err)
	}
	return c, nil
}
