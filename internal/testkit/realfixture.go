package testkit

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/fragment"
)

// BrokenCase is one way to break a copy of a real fixture's folder and
// the error reading the broken copy must give.
type BrokenCase struct {
	Name  string
	Break func(dir string) error // changes the copy in place
	Want  string                 // a part of the error
}

// Broken runs every case on a fresh copy of the folder src: read of the
// broken copy must fail with an error containing the case's Want.
func Broken(t *testing.T, src string, cases []BrokenCase, read func(dir string) error) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			d := CopyTree(t, src)
			if err := c.Break(d); err != nil {
				t.Fatal(err)
			}
			if err := read(d); err == nil || !strings.Contains(err.Error(), c.Want) {
				t.Fatalf("error %v, want one containing %q", err, c.Want)
			}
		})
	}
}

// SameOptions say how SameAtomic compares two atomic checkpoints.
type SameOptions struct {
	// Ordered wants the parameters in the same order; else they are
	// matched by name.
	Ordered bool
	// Files wants byte-identical state files; else each state's values
	// and shape are compared (a source of another TP records other split
	// metadata beside 'param'). Step files are compared byte for byte
	// unless StepOf is given.
	Files bool
	// StepOf, when not nil, gives a parameter's step as a string, and the
	// steps are compared by it (a writer may save the step in another
	// form of the same number).
	StepOf func(tb testing.TB, dir, param string) string
	// ExtraStep lets b hold a step state where a holds none.
	ExtraStep bool
}

// SameAtomic fails the test unless atomic checkpoints a and b hold the
// same parameters (name, shape, frozen, vocabulary size, aliases) with the
// same states, compared as o says: the check of a round trip through a
// writer and back.
func SameAtomic(tb testing.TB, a, b string, o SameOptions) {
	tb.Helper()
	ma, err := atomic.ReadManifest(a)
	if err != nil {
		tb.Fatal(err)
	}
	mb, err := atomic.ReadManifest(b)
	if err != nil {
		tb.Fatal(err)
	}
	if len(ma.Params) != len(mb.Params) {
		tb.Fatalf("%d parameters, want %d", len(mb.Params), len(ma.Params))
	}
	byName := map[string]atomic.ParamEntry{}
	for _, p := range mb.Params {
		byName[p.Name] = p
	}
	for i, pa := range ma.Params {
		pb, ok := byName[pa.Name]
		if o.Ordered {
			pb, ok = mb.Params[i], mb.Params[i].Name == pa.Name
		}
		if !ok {
			tb.Errorf("parameter %d: %s missing after the round trip", i, pa.Name)
			continue
		}
		if fmt.Sprint(pa.Shape) != fmt.Sprint(pb.Shape) || pa.Frozen != pb.Frozen || pa.VocabSize != pb.VocabSize ||
			strings.Join(pa.Aliases, ",") != strings.Join(pb.Aliases, ",") {
			tb.Errorf("%s: shape %v frozen %v vocab %d aliases %v, want %v %v %d %v", pa.Name, pb.Shape, pb.Frozen, pb.VocabSize, pb.Aliases,
				pa.Shape, pa.Frozen, pa.VocabSize, pa.Aliases)
			continue
		}
		files := map[string]atomic.StateEntry{}
		for _, f := range pb.Files {
			files[f.State] = f
		}
		if len(pa.Files) != len(pb.Files) && !(o.ExtraStep && len(pa.Files)+1 == len(pb.Files) && files[fragment.StepState].Path != "") {
			tb.Errorf("%s: states %v, want %v", pa.Name, pb.Files, pa.Files)
			continue
		}
		for _, fa := range pa.Files {
			fb, ok := files[fa.State]
			if !ok {
				tb.Errorf("%s: no state %s after the round trip", pa.Name, fa.State)
				continue
			}
			if !bytes.Equal(stateBytes(tb, a, pa.Name, fa, o), stateBytes(tb, b, pa.Name, fb, o)) {
				tb.Errorf("%s: %s differs from %s", pa.Name, filepath.Join(b, fb.Path), filepath.Join(a, fa.Path))
			}
		}
	}
}

// stateBytes is what SameAtomic compares of state f of param in dir.
func stateBytes(tb testing.TB, dir, param string, f atomic.StateEntry, o SameOptions) []byte {
	tb.Helper()
	switch {
	case f.State == fragment.StepState && o.StepOf != nil:
		return []byte(o.StepOf(tb, dir, param))
	case f.State == fragment.StepState || o.Files:
		b, err := os.ReadFile(filepath.Join(dir, f.Path))
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
	v, shape, err := ReadAtomic(filepath.Join(dir, f.Path))
	if err != nil {
		tb.Fatal(err)
	}
	return append(v, fmt.Sprint(shape)...)
}
