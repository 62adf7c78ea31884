package pyobj

import (
	"archive/zip"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fuzzHooks give a few globals a meaning, as torch's hooks do, so that the
// hook paths are fuzzed too: calls return their arguments as a tuple and
// persistent ids come back wrapped.
func fuzzHooks() Hooks {
	return Hooks{
		Resolve: func(module, name string) (Callable, bool) {
			if module == "torch._utils" || module == "hook" {
				return recorder(func(a []Value) (Value, error) { return Tuple(append([]Value{}, a...)), nil }), true
			}
			return nil, false
		},
		PersistentLoad: func(pid Value) (Value, error) { return Tuple{"pid", pid}, nil },
	}
}

// fuzzSeeds are the CPython protocol pickles, the data.pkl of every torch
// fixture and the legacy fixtures (whose first pickle is the magic number).
func fuzzSeeds(f *testing.F) {
	pkls, _ := filepath.Glob(filepath.Join(fixtureDir, "*.pkl"))
	for _, p := range pkls {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	pts, _ := filepath.Glob(filepath.Join(fixtureDir, "*.pt"))
	for _, p := range pts {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			// Legacy: the object pickle follows three small ones.
			rest := b
			for i := 0; i < 4; i++ {
				n, err := Scan(rest, DefaultLimits())
				if err != nil {
					break
				}
				f.Add(rest[:n])
				rest = rest[n:]
			}
			continue
		}
		for _, zf := range zr.File {
			if strings.HasSuffix(zf.Name, "/data.pkl") {
				rc, _ := zf.Open()
				pkl, _ := io.ReadAll(rc)
				rc.Close()
				f.Add(pkl)
			}
		}
	}
	if len(pkls) == 0 || len(pts) == 0 {
		f.Fatalf("no fixtures in %s", fixtureDir)
	}
}

// FuzzUnpickle: any input decodes or fails with an error (never a panic,
// which Unpickle would report as "malformed"), and whatever decodes can be
// walked, printed, encoded, and decoded again to the same value.
func FuzzUnpickle(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		opt := Options{Hooks: fuzzHooks(), Globals: map[string]int{}, Limits: Limits{MaxOps: 1 << 20}}
		v, err := Unpickle(data, opt)
		if err != nil {
			if strings.Contains(err.Error(), "malformed") {
				t.Fatalf("recovered from a panic: %v", err)
			}
			return
		}
		visits := 0
		if err := Walk(v, DefaultLimits(), func(path []Value, x Value) error {
			if visits++; visits > 100_000 {
				return ErrSkip
			}
			_ = Repr(x)
			_ = PathString(path)
			return nil
		}); err != nil && !strings.Contains(err.Error(), "values to walk") {
			t.Fatalf("Walk: %v", err)
		}
		enc, err := Marshal(v, nil)
		if err != nil {
			return // hook results (FuncRef) and over-deep sets cannot be encoded
		}
		v2, err := Unpickle(enc, Options{Hooks: fuzzHooks()})
		if err != nil {
			t.Fatalf("decoding Marshal's output: %v\n%q", err, enc)
		}
		// 100k nodes, as Walk above: a shared DAG of 40 tuple levels
		// (testdata/fuzz/FuzzUnpickle/18e241ccc1a04833) took 28 s to
		// expand to 1M nodes twice, which the fuzzer reports as a hang.
		t1, ok1 := typedLimited(v, 100_000)
		t2, ok2 := typedLimited(v2, 100_000)
		if !ok1 || !ok2 {
			return // too much sharing to compare in full
		}
		if a, b := canon(t1), canon(t2); a != b {
			t.Fatalf("round trip changed the value:\n%s\n%s", a, b)
		}
	})
}
