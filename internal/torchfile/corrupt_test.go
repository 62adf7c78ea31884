package torchfile

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ucp-project/ucp/internal/pyobj"
)

var updateCorrupt = flag.Bool("update-corrupt", false, "rewrite testdata/corrupt from the fixtures")

// corruptDir holds small broken files derived from the torch fixtures by
// corruptCases (regenerate with go test ./torchfile -run TestCorrupt -update-corrupt).
const corruptDir = "../../testdata/corrupt"

type zrec struct {
	name   string // without the archive folder
	data   []byte
	method uint16
}

// fixtureRecords returns the archive folder and records of a zip fixture.
func fixtureRecords(t testing.TB, name string) (string, []zrec) {
	t.Helper()
	zr, err := zip.OpenReader(filepath.Join(fixtureDir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	prefix := zr.File[0].Name[:strings.IndexByte(zr.File[0].Name, '/')]
	var recs []zrec
	for _, zf := range zr.File {
		rc, err := zf.Open()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, zrec{name: strings.TrimPrefix(zf.Name, prefix+"/"), data: b})
	}
	return prefix, recs
}

// zipOf builds a zip with archive/zip (deterministic: no timestamps).
// A record name starting with "/" is written without the folder.
func zipOf(t testing.TB, prefix string, recs []zrec) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	zw.RegisterCompressor(zip.Deflate, func(w io.Writer) (io.WriteCloser, error) {
		return flate.NewWriter(w, flate.BestCompression)
	})
	for _, r := range recs {
		name := prefix + "/" + r.name
		if strings.HasPrefix(r.name, "/") {
			name = r.name[1:]
		}
		w, err := zw.CreateHeader(&zip.FileHeader{Name: name, Method: r.method})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(r.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// editRecords returns the views fixture's records changed by edit.
func editRecords(t testing.TB, edit func([]zrec) []zrec) []byte {
	prefix, recs := fixtureRecords(t, "views.pt")
	return zipOf(t, prefix, edit(recs))
}

func without(recs []zrec, name string) []zrec {
	var out []zrec
	for _, r := range recs {
		if r.name != name {
			out = append(out, r)
		}
	}
	return out
}

func replace(recs []zrec, name string, f func(zrec) zrec) []zrec {
	out := append([]zrec(nil), recs...)
	for i := range out {
		if out[i].name == name {
			out[i] = f(out[i])
		}
	}
	return out
}

// rawTensor is a _rebuild_tensor_v2 call with arbitrary (possibly wrong)
// arguments, for crafting pickles.
type rawTensor struct {
	class        string
	key          string
	numel        pyobj.Value
	offset       pyobj.Value
	size, stride pyobj.Tuple
}

func tensorPickle(t testing.TB, kv ...pyobj.Value) []byte {
	t.Helper()
	d := pyobj.NewDict(pyobj.OrderedDict)
	for i := 0; i+1 < len(kv); i += 2 {
		d.Set(kv[i], kv[i+1])
	}
	pkl, err := pyobj.Marshal(d, func(e *pyobj.Encoder, v pyobj.Value) (bool, error) {
		rt, ok := v.(*rawTensor)
		if !ok {
			return false, nil
		}
		e.Global("torch._utils", "_rebuild_tensor_v2")
		e.Op('(', '(')
		e.Encode("storage")
		e.Global("torch", rt.class)
		for _, x := range []pyobj.Value{rt.key, "cpu", rt.numel} {
			if err := e.Encode(x); err != nil {
				return true, err
			}
		}
		e.Op('t', 'Q')
		for _, x := range []pyobj.Value{rt.offset, rt.size, rt.stride, false, pyobj.NewDict(pyobj.OrderedDict)} {
			if err := e.Encode(x); err != nil {
				return true, err
			}
		}
		e.Op('t', 'R')
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkl
}

func f32Tensor(numel, offset int64, size, stride pyobj.Tuple) *rawTensor {
	return &rawTensor{"FloatStorage", "0", numel, offset, size, stride}
}

// withPickle is a zip with the given data.pkl, data/0 of 48 bytes
// (12 float32) and a version record.
func withPickle(t testing.TB, pkl []byte) []byte {
	return zipOf(t, "crafted", []zrec{
		{name: "data.pkl", data: pkl}, {name: "data/0", data: make([]byte, 48)}, {name: "version", data: []byte("3\n")}})
}

func tup(vs ...int64) pyobj.Tuple {
	t := make(pyobj.Tuple, len(vs))
	for i, v := range vs {
		t[i] = v
	}
	return t
}

func u64le(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func fixtureBytes(t testing.TB, name string) []byte {
	b, err := os.ReadFile(filepath.Join(fixtureDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// legacyStorageCount returns the offset of the u64 element count before
// the last storage of a legacy fixture.
func legacyStorageCount(t testing.TB, name string) int64 {
	f, err := Open(filepath.Join(fixtureDir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var last int64
	for _, st := range f.Storages {
		last = max(last, st.Offset)
	}
	return last - 8
}

type corruptCase struct {
	name  string
	build func(t testing.TB) []byte
	want  string // substring of the error
	big   bool   // generated in memory only, not kept in testdata/corrupt
}

var corruptCases = []corruptCase{
	{"empty.pt", func(t testing.TB) []byte { return nil }, "too short to be a torch file", false},
	{"text.pt", func(t testing.TB) []byte { return []byte("this is not a checkpoint\n") }, "not a torch.save file", false},
	{"truncated_half.pt", func(t testing.TB) []byte { b := fixtureBytes(t, "views.pt"); return b[:len(b)/2] }, "corrupt zip archive", false},
	{"truncated_end.pt", func(t testing.TB) []byte { b := fixtureBytes(t, "views.pt"); return b[:len(b)-1] }, "corrupt zip archive", false},
	{"bad_central_dir.pt", func(t testing.TB) []byte {
		b := bytes.Clone(fixtureBytes(t, "views.pt"))
		i := bytes.Index(b, []byte("PK\x01\x02"))
		b[i+3] = 9
		return b
	}, "corrupt zip archive", false},
	{"central_dir_offset.pt", func(t testing.TB) []byte {
		// The first central-directory entry points its local header past the end.
		b := bytes.Clone(fixtureBytes(t, "views.pt"))
		i := bytes.Index(b, []byte("PK\x01\x02"))
		binary.LittleEndian.PutUint32(b[i+42:], 0x7fff0000)
		return b
	}, "record views/data.pkl", false},
	{"no_data_pkl.pt", func(t testing.TB) []byte {
		return editRecords(t, func(r []zrec) []zrec { return without(r, "data.pkl") })
	}, "zip archive has no data.pkl record", false},
	{"no_version.pt", func(t testing.TB) []byte {
		return editRecords(t, func(r []zrec) []zrec { return without(r, "version") })
	}, "no version record", false},
	{"outside_folder.pt", func(t testing.TB) []byte {
		return editRecords(t, func(r []zrec) []zrec { return append(r, zrec{name: "/elsewhere/data.pkl", data: []byte("x")}) })
	}, `zip record "elsewhere/data.pkl" is outside the archive folder "views"`, false},
	{"no_folder.pt", func(t testing.TB) []byte {
		return zipOf(t, "", []zrec{{name: "/data.pkl", data: []byte("\x80\x02N.")}, {name: "/version", data: []byte("3\n")}})
	}, `zip record "data.pkl" is not in a folder`, false},
	{"torchscript.pt", func(t testing.TB) []byte {
		return editRecords(t, func(r []zrec) []zrec { return append(r, zrec{name: "constants.pkl", data: []byte("\x80\x02).")}) })
	}, "TorchScript archive", false},
	{"duplicate_record.pt", func(t testing.TB) []byte {
		return editRecords(t, func(r []zrec) []zrec { return append(r, zrec{name: "data/0", data: make([]byte, 48)}) })
	}, `zip record "views/data/0" appears twice`, false},
	{"byteorder_big.pt", func(t testing.TB) []byte {
		return editRecords(t, func(r []zrec) []zrec { return append(r, zrec{name: "byteorder", data: []byte("big")}) })
	}, `byteorder "big" is not supported`, false},
	{"storage_short.pt", func(t testing.TB) []byte {
		return editRecords(t, func(r []zrec) []zrec {
			return replace(r, "data/0", func(z zrec) zrec { z.data = z.data[:len(z.data)-4]; return z })
		})
	}, "storage record data/0 has 44 bytes, but its 12 float32 elements need 48", false},
	{"storage_long.pt", func(t testing.TB) []byte {
		return editRecords(t, func(r []zrec) []zrec {
			return replace(r, "data/1", func(z zrec) zrec { z.data = append(z.data, 0, 0); return z })
		})
	}, "storage record data/1 has 42 bytes, but its 20 float16 elements need 40", false},
	{"storage_missing.pt", func(t testing.TB) []byte {
		return editRecords(t, func(r []zrec) []zrec { return without(r, "data/1") })
	}, "storage record data/1 is missing", false},
	{"storage_deflated.pt", func(t testing.TB) []byte {
		return editRecords(t, func(r []zrec) []zrec {
			return replace(r, "data/2", func(z zrec) zrec { z.method = zip.Deflate; return z })
		})
	}, "storage record data/2 is compressed", false},
	{"offset_past_end.pt", func(t testing.TB) []byte {
		return withPickle(t, tensorPickle(t, "w", f32Tensor(12, 12, tup(1), tup(1))))
	}, "reaches past its storage of 48 bytes", false},
	{"view_past_end.pt", func(t testing.TB) []byte {
		return withPickle(t, tensorPickle(t, "w", f32Tensor(12, 4, tup(3, 4), tup(4, 1))))
	}, "tensor view (offset 4, shape [3 4], stride [4 1]) reaches past its storage", false},
	{"stride_past_end.pt", func(t testing.TB) []byte {
		return withPickle(t, tensorPickle(t, "w", f32Tensor(12, 0, tup(2, 2), tup(1, 11))))
	}, "reaches past its storage", false},
	{"stride_overflow.pt", func(t testing.TB) []byte {
		return withPickle(t, tensorPickle(t, "w", f32Tensor(12, 0, tup(3, 3), tup(1<<62, 1))))
	}, "overflows", false},
	{"negative_stride.pt", func(t testing.TB) []byte {
		return withPickle(t, tensorPickle(t, "w", f32Tensor(12, 11, tup(3), tup(-1))))
	}, "negative size or stride in dim 0", false},
	{"negative_size.pt", func(t testing.TB) []byte {
		return withPickle(t, tensorPickle(t, "w", f32Tensor(12, 0, tup(2, -3), tup(3, 1))))
	}, "negative size or stride in dim 1", false},
	{"negative_offset.pt", func(t testing.TB) []byte {
		return withPickle(t, tensorPickle(t, "w", f32Tensor(12, -1, tup(2), tup(1))))
	}, "negative storage offset -1", false},
	{"size_stride_mismatch.pt", func(t testing.TB) []byte {
		return withPickle(t, tensorPickle(t, "w", f32Tensor(12, 0, tup(2, 3), tup(1))))
	}, "tensor has 2 sizes but 1 strides", false},
	{"offset_not_int.pt", func(t testing.TB) []byte {
		return withPickle(t, tensorPickle(t, "w", &rawTensor{"FloatStorage", "0", int64(12), "0", tup(2), tup(1)}))
	}, "storage offset is str, not an int", false},
	{"expanded_huge.pt", func(t testing.TB) []byte {
		// Valid: a stride-0 view of 2^40 elements on a 12-element storage
		// (torch saves expanded tensors so). Reading it whole is the
		// caller's choice; opening and ranged reads must stay cheap.
		return withPickle(t, tensorPickle(t, "w", f32Tensor(12, 3, tup(1<<20, 1<<20), tup(0, 0))))
	}, "", false},
	{"expanded_overflow.pt", func(t testing.TB) []byte {
		return withPickle(t, tensorPickle(t, "w", f32Tensor(12, 0, tup(1<<40, 1<<21), tup(0, 0))))
	}, "tensor shape [1099511627776 2097152] overflows", false},
	{"numel_huge.pt", func(t testing.TB) []byte {
		return withPickle(t, tensorPickle(t, "w", f32Tensor(1<<60, 0, tup(2), tup(1))))
	}, "storage persistent id has bad key, location or size", false},
	{"numel_mismatch.pt", func(t testing.TB) []byte {
		return withPickle(t, tensorPickle(t, "w", f32Tensor(1<<40, 0, tup(2), tup(1))))
	}, "storage record data/0 has 48 bytes, but its 1099511627776 float32 elements need 4398046511104", false},
	{"storage_class_unknown.pt", func(t testing.TB) []byte {
		return withPickle(t, tensorPickle(t, "w", &rawTensor{"FooStorage", "0", int64(12), int64(0), tup(2), tup(1)}))
	}, "unknown storage class torch.FooStorage", false},
	{"storage_two_dtypes.pt", func(t testing.TB) []byte {
		return withPickle(t, tensorPickle(t, "a", f32Tensor(12, 0, tup(2), tup(1)),
			"b", &rawTensor{"HalfStorage", "0", int64(24), int64(0), tup(2), tup(1)}))
	}, "storage 0 is referenced as float32[12] and as float16[24]", false},
	{"storage_key_escape.pt", func(t testing.TB) []byte {
		return withPickle(t, tensorPickle(t, "w", &rawTensor{"FloatStorage", "../version", int64(12), int64(0), tup(2), tup(1)}))
	}, "storage record data/../version is missing", false},
	{"bad_opcode.pt", func(t testing.TB) []byte { return withPickle(t, []byte("\x80\x02K\x01\xff.")) },
		"crafted/data.pkl: pickle: invalid opcode 0xff at byte 4", false},
	{"binunicode8_huge.pt", func(t testing.TB) []byte {
		return withPickle(t, cat([]byte("\x80\x02\x8d"), u64le(1<<60), []byte("abc.")))
	}, "BINUNICODE8 at byte 2 claims 1152921504606846976 bytes but only 4 are left", false},
	{"binbytes8_huge.pt", func(t testing.TB) []byte {
		return withPickle(t, cat([]byte("\x80\x02\x8e"), u64le(1<<60), []byte("abc.")))
	}, "BINBYTES8 at byte 2 claims 1152921504606846976 bytes", false},
	{"bytearray8_huge.pt", func(t testing.TB) []byte {
		return withPickle(t, cat([]byte("\x80\x02\x96"), u64le(^uint64(0)), []byte("abc.")))
	}, "BYTEARRAY8 at byte 2 claims 18446744073709551615 bytes", false},
	{"frame_huge.pt", func(t testing.TB) []byte {
		return withPickle(t, cat([]byte("\x80\x04\x95"), u64le(1<<60), []byte("N.")))
	}, "FRAME at byte 2 claims 1152921504606846976 bytes", false},
	{"binunicode_huge.pt", func(t testing.TB) []byte {
		return withPickle(t, []byte("\x80\x02X\xff\xff\xff\x7fabc."))
	}, "BINUNICODE at byte 2 claims 2147483647 bytes", false},
	{"long4_negative.pt", func(t testing.TB) []byte {
		return withPickle(t, []byte("\x80\x02\x8b\xff\xff\xff\xffabc."))
	}, "LONG4 at byte 2 has negative length", false},
	{"no_stop.pt", func(t testing.TB) []byte { return withPickle(t, []byte("\x80\x02K\x01")) },
		"no STOP opcode", false},
	{"stack_underflow.pt", func(t testing.TB) []byte { return withPickle(t, []byte("\x80\x02a.")) },
		"pickle: APPEND at byte 2: stack underflow", false},
	{"mark_underflow.pt", func(t testing.TB) []byte { return withPickle(t, []byte("\x80\x02K\x01t.")) },
		"pickle: TUPLE at byte 4: no MARK to pop to", false},
	{"odd_setitems.pt", func(t testing.TB) []byte { return withPickle(t, []byte("\x80\x02}(K\x01u.")) },
		"SETITEMS at byte 6: odd number of items (1)", false},
	{"odd_dict.pt", func(t testing.TB) []byte { return withPickle(t, []byte("\x80\x02(K\x01K\x02K\x03d.")) },
		"DICT at byte 9: odd number of items (3)", false},
	{"memo_missing.pt", func(t testing.TB) []byte { return withPickle(t, []byte("\x80\x02h\x05.")) },
		"BINGET at byte 2: memo key 5 was never stored", false},
	{"append_to_int.pt", func(t testing.TB) []byte { return withPickle(t, []byte("\x80\x02K\x01K\x02a.")) },
		"APPEND requires ListAppender", false},
	{"reduce_not_tuple.pt", func(t testing.TB) []byte { return withPickle(t, []byte("\x80\x02cos\nsystem\nK\x01R.")) },
		"REDUCE args must be *Tuple", false},
	{"persid_not_tuple.pt", func(t testing.TB) []byte {
		return withPickle(t, []byte("\x80\x02X\x01\x00\x00\x00xQ."))
	}, "pickle: at byte 9: persistent id is str, not a tuple", false},
	{"persid_kind.pt", func(t testing.TB) []byte {
		return withPickle(t, []byte("\x80\x02X\x03\x00\x00\x00bad\x85Q."))
	}, "persistent id of kind \"bad\", want 'storage'", false},
	{"protocol_6.pt", func(t testing.TB) []byte { return withPickle(t, []byte("\x80\x06N.")) },
		"unsupported pickle protocol: 6", false},
	{"cycle_list.pt", func(t testing.TB) []byte { return withPickle(t, []byte("\x80\x02]q\x00h\x00a.")) },
		"list contains itself", false},
	{"cycle_dict.pt", func(t testing.TB) []byte {
		return withPickle(t, []byte("\x80\x02}q\x00X\x01\x00\x00\x00ah\x00s."))
	}, "dict contains itself", false},
	{"deep_lists_300.pt", func(t testing.TB) []byte { return withPickle(t, deepLists(300)) },
		"objects nest deeper than 256 levels", false},
	{"deep_lists_100k.pt", func(t testing.TB) []byte { return withPickle(t, deepLists(100_000)) },
		"objects nest deeper than 256 levels", true},
	{"deep_tuples_1m.pt", func(t testing.TB) []byte {
		// TUPLE1 a million times: one byte per level.
		return withPickle(t, cat([]byte("\x80\x02N"), bytes.Repeat([]byte{0x85}, 1_000_000), []byte(".")))
	}, "objects nest deeper than 256 levels", true},
	{"deep_tuple_key.pt", func(t testing.TB) []byte {
		// A dict key nested 200k tuples deep: hashing it must not recurse that far.
		return withPickle(t, cat([]byte("\x80\x02}N"), bytes.Repeat([]byte{0x85}, 200_000), []byte("Ns.")))
	}, "objects nest deeper than 256 levels", true},
	{"many_marks.pt", func(t testing.TB) []byte {
		return withPickle(t, cat([]byte("\x80\x02"), bytes.Repeat([]byte("("), 100_000), []byte("N.")))
	}, "pickle: MARK at byte 1042: more than 1040 nested MARKs", true},
	{"many_marks_small.pt", func(t testing.TB) []byte {
		return withPickle(t, cat([]byte("\x80\x02"), bytes.Repeat([]byte("("), 2000), []byte("N.")))
	}, "more than 1040 nested MARKs", false},
	{"shared_tuple_bomb.pt", func(t testing.TB) []byte {
		// t0 = (s, s), t1 = (t0, t0), ...: 2^60 paths, 60 levels of sharing,
		// then used as a dict key and walked.
		b := []byte("\x80\x02}X\x00\x01\x00\x00" + strings.Repeat("s", 256) + "q\x000")
		for i := 0; i < 60; i++ {
			b = append(b, 'h', byte(i), 'h', byte(i), 0x86, 'q', byte(i+1), '0')
		}
		return withPickle(t, append(b, "h<Ns."...))
	}, "", false},
	{"shared_key_tuple.pt", func(t testing.TB) []byte {
		// 200k dict items whose key is one shared tuple holding a 2000-byte
		// string: hashing each must not cost the string.
		s := "\x80\x02}X" + string(binary.LittleEndian.AppendUint32(nil, 2000)) + strings.Repeat("s", 2000) +
			"\x85q\x000(" + strings.Repeat("h\x00N", 200_000) + "u."
		return withPickle(t, []byte(s))
	}, "", true},
	{"shared_big_int.pt", func(t testing.TB) []byte {
		// A list of 100k references to one 800k-bit int: printing each
		// must not convert it to decimal.
		s := "\x80\x02]\x8b" + string(binary.LittleEndian.AppendUint32(nil, 100_000)) + strings.Repeat("\x11", 100_000) +
			"q\x010(" + strings.Repeat("h\x01", 100_000) + "e."
		return withPickle(t, []byte(s))
	}, "", true},
	{"persid_shared_kind.pt", func(t testing.TB) []byte {
		// A persistent id whose kind is a tuple doubling at each of 60
		// levels through the memo: an error message that printed it with
		// fmt would never finish.
		s := "\x80\x02X\x01\x00\x00\x00a"
		for i := 0; i < 60; i++ {
			s += "q\x00h\x00\x86"
		}
		s += "\x85Q."
		return withPickle(t, []byte(s))
	}, "persistent id of kind (((", false},
	{"legacy_bad_magic.pt", func(t testing.TB) []byte {
		b := bytes.Clone(fixtureBytes(t, "legacy_views.pt"))
		b[6] ^= 0x40
		return b
	}, "legacy magic number missing", false},
	{"legacy_bad_protocol.pt", func(t testing.TB) []byte {
		b := bytes.Clone(fixtureBytes(t, "legacy_views.pt"))
		if !bytes.Equal(b[15:21], []byte("\x80\x02M\xe9\x03.")) {
			t.Fatalf("legacy_views.pt: unexpected protocol pickle % x", b[15:21])
		}
		b[18] = 0xea
		return b
	}, "legacy protocol version 1002, want 1001", false},
	{"legacy_truncated_storage.pt", func(t testing.TB) []byte {
		b := fixtureBytes(t, "legacy_views.pt")
		return b[:len(b)-1]
	}, "file ends inside its data", false},
	{"legacy_truncated_header.pt", func(t testing.TB) []byte {
		b := fixtureBytes(t, "legacy_views.pt")
		return b[:legacyStorageCount(t, "legacy_views.pt")+4]
	}, "file ends before its header", false},
	{"legacy_count_mismatch.pt", func(t testing.TB) []byte {
		b := bytes.Clone(fixtureBytes(t, "legacy_views.pt"))
		at := legacyStorageCount(t, "legacy_views.pt")
		binary.LittleEndian.PutUint64(b[at:], binary.LittleEndian.Uint64(b[at:])+1)
		return b
	}, "elements, but the pickle says", false},
	{"legacy_truncated_pickle.pt", func(t testing.TB) []byte {
		b := fixtureBytes(t, "legacy_views.pt")
		return b[:300]
	}, "legacy object pickle at offset 137: pickle: truncated: BINPUT at byte 162", false},
	{"legacy_huge_string.pt", func(t testing.TB) []byte {
		// The object pickle claims a 2^62-byte string.
		b := fixtureBytes(t, "legacy_views.pt")
		return cat(b[:21], []byte("\x80\x02\x8d"), u64le(1<<62), []byte("N."))
	}, "legacy sys_info: pickle: truncated: BINUNICODE8 at byte 2 claims 4611686018427387904 bytes", false},
	{"views_1m.pt", func(t testing.TB) []byte {
		// 88 MB of pickle for a million one-element views of one storage:
		// decoding took 3 GB and 40 s before the budget (issue 26, 10).
		return zipOf(t, "views_1m", []zrec{{name: "data.pkl", data: viewsPickle(1_000_000)},
			{name: "data/0", data: make([]byte, 4_000_000)}, {name: "version", data: []byte("3\n")}})
	}, "views_1m/data.pkl: pickle: decoding would need more than its memory budget of 1339 MiB", true},
	{"views_100k.pt", func(t testing.TB) []byte {
		// 8 MB: past the 256 MiB floor of the budget.
		return zipOf(t, "views_100k", []zrec{{name: "data.pkl", data: viewsPickle(100_000)},
			{name: "data/0", data: make([]byte, 400_000)}, {name: "version", data: []byte("3\n")}})
	}, "decoding would need more than its memory budget of 256 MiB", true},
	{"deflated_bytes_bomb.pt", func(t testing.TB) []byte {
		// 200 MB of pickled bytes deflated into a ~200 KB record: 950 MB
		// to open before the budget.
		return deflatedBytesPickle(t, 200<<20)
	}, "bomb/data.pkl has 209715212 bytes of pickle; decoding them would need more than the memory budget of 256 MiB", true},
}

// viewsPickle is the data.pkl torch.save writes for
// {f"v{i}": base[i:i+1] for i in range(n)} with base = torch.zeros(n):
// byte for byte what torch 1.13 wrote for n = 300 (memo keys past 255
// take LONG_BINPUT, ints past 65535 BININT, as CPython's pickler does).
func viewsPickle(n int) []byte {
	put := func(b []byte, k int) []byte {
		if k < 256 {
			return append(b, 'q', byte(k))
		}
		return binary.LittleEndian.AppendUint32(append(b, 'r'), uint32(k))
	}
	num := func(b []byte, v int) []byte {
		switch {
		case v < 256:
			return append(b, 'K', byte(v))
		case v < 65536:
			return binary.LittleEndian.AppendUint16(append(b, 'M'), uint16(v))
		}
		return binary.LittleEndian.AppendUint32(append(b, 'J'), uint32(v))
	}
	b := make([]byte, 0, 90*n)
	b = append(b, "\x80\x02}q\x00("...)
	memo := 1
	for i := 0; i < n; i++ {
		key := "v" + strconv.Itoa(i)
		b = append(binary.LittleEndian.AppendUint32(append(b, 'X'), uint32(len(key))), key...)
		b = put(b, memo)
		if i == 0 {
			// The globals and the persistent id's strings, memoized as 2-6.
			b = append(b, "ctorch._utils\n_rebuild_tensor_v2\nq\x02((X\x07\x00\x00\x00storageq\x03"+
				"ctorch\nFloatStorage\nq\x04X\x01\x00\x00\x000q\x05X\x03\x00\x00\x00cpuq\x06"...)
			memo = 7
		} else {
			b = append(b, "h\x02((h\x03h\x04h\x05h\x06"...)
			memo++
		}
		b = put(append(num(b, n), 't'), memo) // the persistent id
		b = num(append(b, 'Q'), i)            // storage offset
		b = put(append(b, 'K', 1, 0x85), memo+1)
		b = put(append(b, 'K', 1, 0x85), memo+2)
		b = append(b, 0x89) // requires_grad
		if i == 0 {
			b = append(b, "ccollections\nOrderedDict\nq\n"...)
			memo = 11
		} else {
			b = append(b, 'h', 10)
			memo += 3
		}
		b = put(append(b, ')', 'R'), memo)
		b = put(append(b, 't'), memo+1)
		b = put(append(b, 'R'), memo+2)
		memo += 3
	}
	return append(b, 'u', '.')
}

// deflatedBytesPickle is a zip "bomb/" whose data.pkl, deflated, is a
// pickle of one n-byte bytes object of zeros (written in pieces: the test
// never holds it).
func deflatedBytesPickle(t testing.TB, n int) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	zw.RegisterCompressor(zip.Deflate, func(w io.Writer) (io.WriteCloser, error) {
		return flate.NewWriter(w, flate.BestCompression)
	})
	w, err := zw.CreateHeader(&zip.FileHeader{Name: "bomb/data.pkl", Method: zip.Deflate})
	if err != nil {
		t.Fatal(err)
	}
	zeros := make([]byte, 1<<20)
	parts := [][]byte{cat([]byte("\x80\x02\x8e"), u64le(uint64(n)))}
	for left := n; left > 0; left -= len(zeros) {
		parts = append(parts, zeros[:min(left, len(zeros))])
	}
	for _, p := range append(parts, []byte(".")) {
		if _, err := w.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	if w, err = zw.CreateHeader(&zip.FileHeader{Name: "bomb/version"}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("3\n")); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// deepLists is a pickle of n nested lists: [[[...]]] built with APPEND.
func deepLists(n int) []byte {
	return cat([]byte("\x80\x02"), bytes.Repeat([]byte("]"), n), bytes.Repeat([]byte("a"), n-1), []byte("."))
}

// TestCorrupt opens every broken file and expects an error that names the
// file and the problem, within bounded time and memory, never a panic.
func TestCorrupt(t *testing.T) {
	for _, c := range corruptCases {
		t.Run(c.name, func(t *testing.T) {
			data := c.build(t)
			path := filepath.Join(corruptDir, c.name)
			if !c.big {
				if *updateCorrupt {
					if err := os.WriteFile(path, data, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				kept, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (regenerate with -update-corrupt)", err)
				}
				if !bytes.Equal(kept, data) {
					t.Fatalf("%s differs from what corruptCases builds (regenerate with -update-corrupt)", path)
				}
			} else {
				path = filepath.Join(t.TempDir(), c.name)
				if err := os.WriteFile(path, data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := openBounded(t, path, int64(len(data)))
			if c.want == "" {
				// Valid but adversarial: must decode, in bounded time and memory.
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", c.want)
			}
			if !strings.HasPrefix(err.Error(), path+": ") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q\nwant it to start with %q and contain %q", err, path+": ", c.want)
			}
		})
	}
}

// openBounded opens path (and walks it, reading every tensor), failing the
// test if that takes more than a few seconds or allocates more than a
// small multiple of the input.
func openBounded(t *testing.T, path string, size int64) error {
	t.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	err := func() error {
		f, err := Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		return walkAndRead(f)
	}()
	runtime.ReadMemStats(&after)
	if d := time.Since(start); d > 20*time.Second { // generous: CI machines are shared
		t.Errorf("took %v", d)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(64*size+(64<<20)) {
		t.Errorf("allocated %d bytes for a %d-byte file", alloc, size)
	}
	return err
}

// walkAndRead visits every value of f and reads every tensor (at most
// 1 MiB of each: zero strides make huge valid views of small storages).
func walkAndRead(f *File) error {
	// Pickles can share containers so that paths multiply: Walk stops at
	// MaxVisits, but rendering that many values would make the fuzzer
	// spend seconds per input in this harness, so stop much earlier.
	visits := 0
	return pyobj.Walk(f.Root, pyobj.DefaultLimits(), func(path []pyobj.Value, v pyobj.Value) error {
		if visits++; visits > 1<<17 {
			return fmt.Errorf("more than %d values to walk in this harness", 1<<17)
		}
		_ = pyobj.Repr(v)
		t, ok := v.(*Tensor)
		if !ok {
			return nil
		}
		es := int64(t.DType.Size())
		n := min(t.Numel(), (1<<20)/max(es, 1))
		buf := make([]byte, n*es)
		if err := f.ReadRange(t, 0, n, buf); err != nil {
			return fmt.Errorf("%s: %w", pyobj.PathString(path), err)
		}
		if n > 2 {
			// A range that starts mid-tensor.
			if err := f.ReadRange(t, n/2, n-n/2, buf[:(n-n/2)*es]); err != nil {
				return fmt.Errorf("%s: %w", pyobj.PathString(path), err)
			}
		}
		return nil
	})
}

// TestTruncatedEverywhere cuts fixtures at every byte: each cut must fail
// with an error naming the file, never panic.
func TestTruncatedEverywhere(t *testing.T) {
	for _, name := range []string{"views.pt", "legacy_views.pt", "dtypes.pt", "legacy_objects.pt", "empty.pt"} {
		data := fixtureBytes(t, name)
		for cut := 0; cut < len(data); cut++ {
			_, err := Read(bytes.NewReader(data[:cut]), int64(cut), name)
			if err == nil {
				t.Errorf("%s cut at %d of %d: no error", name, cut, len(data))
				continue
			}
			if !strings.HasPrefix(err.Error(), name+": ") {
				t.Errorf("%s cut at %d: error %q does not name the file", name, cut, err)
			}
		}
	}
}

// TestBitFlips flips every bit of small fixtures' pickles and headers: the
// reader may accept a changed file, but must not panic or hang.
func TestBitFlips(t *testing.T) {
	if testing.Short() {
		t.Skip("slow")
	}
	for _, name := range []string{"views.pt", "legacy_views.pt"} {
		data := fixtureBytes(t, name)
		limit := min(len(data), 1200)
		for i := 0; i < limit; i++ {
			for bit := 0; bit < 8; bit++ {
				b := bytes.Clone(data)
				b[i] ^= 1 << bit
				f, err := Read(bytes.NewReader(b), int64(len(b)), name)
				if err != nil {
					if !strings.HasPrefix(err.Error(), name+": ") {
						t.Errorf("flip %d.%d: error %q does not name the file", i, bit, err)
					}
					continue
				}
				if err := walkAndRead(f); err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Errorf("flip %d.%d: reading an accepted file: %v", i, bit, err)
				}
			}
		}
	}
}

// TestDotDataVersion: torch 1.13 also accepts .data/version instead of version.
func TestDotDataVersion(t *testing.T) {
	data := editRecords(t, func(r []zrec) []zrec {
		return replace(r, "version", func(z zrec) zrec { z.name = ".data/version"; return z })
	})
	f, err := Read(bytes.NewReader(data), int64(len(data)), "dotdata.pt")
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Storages) != 7 {
		t.Errorf("%d storages", len(f.Storages))
	}
}

// TestExpandedRead: a stride-0 view far larger than its storage reads in
// ranges, and refuses to be read whole rather than allocate terabytes.
func TestExpandedRead(t *testing.T) {
	f, err := Open(filepath.Join(corruptDir, "expanded_huge.pt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, _ := pyobj.Path(f.Root, "w")
	x := v.(*Tensor)
	if x.Numel() != 1<<40 || x.IsContiguous() {
		t.Fatalf("numel %d contiguous %v", x.Numel(), x.IsContiguous())
	}
	if _, err := f.ReadTensor(x); err == nil || !strings.Contains(err.Error(), "too many to read at once") {
		t.Errorf("ReadTensor: %v", err)
	}
	got, err := f.ReadFloat32(x, 1<<40-5, 5)
	if err != nil || len(got) != 5 {
		t.Fatalf("ReadFloat32: %v %v", got, err)
	}
	if _, err := f.ReadFloat32(x, 1<<40-5, 6); err == nil {
		t.Errorf("ReadFloat32 past the end did not fail")
	}
	if err := f.ReadRange(x, math.MaxInt64, 2, make([]byte, 8)); err == nil {
		t.Errorf("ReadRange with an overflowing range did not fail")
	}
}
