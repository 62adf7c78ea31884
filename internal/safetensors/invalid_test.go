package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// Worked example 2: {"step": int64 10, "e": float16 [0,4], "m": uint8 [1,2,3]}.
const (
	ex2Step = `"step":{"dtype":"I64","shape":[],"data_offsets":[0,8]}`
	ex2E    = `"e":{"dtype":"F16","shape":[0,4],"data_offsets":[8,8]}`
	ex2M    = `"m":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}`
)

var ex2Data = []byte{10, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3}

// ex2 returns example 2 with the entry of m replaced.
func ex2(m string) string { return "{" + ex2Step + "," + ex2E + "," + m + "}    " }

func withLen(n uint64, rest []byte) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, n), rest...)
}

type invalidCase struct {
	name string
	file []byte
	kind error  // the error kind (errors.Is), nil for none
	want string // substring of the message, after the file name
}

// invalidCases are files the reader must reject; they also seed FuzzRead.
func invalidCases() []invalidCase {
	valid := fileOf(ex2(ex2M), ex2Data)
	u8 := func(name, shape, offs string) string {
		return `"` + name + `":{"dtype":"U8","shape":` + shape + `,"data_offsets":` + offs + `}`
	}
	return []invalidCase{
		// The invalid variants of worked example 2 (errors as tensor.rs names them).
		{"hole", fileOf(ex2(u8("m", "[3]", "[9,12]")), append(ex2Data, 0)), ErrInvalidOffset, `tensor "m": invalid data_offsets (InvalidOffset): data_offsets [9, 12] leave bytes [8, 9) of the data unused (a hole)`},
		{"trailing byte", append(bytes.Clone(valid), 0), ErrIncompleteBuffer, "end at byte 187 but the file has 188 bytes (trailing bytes after the last tensor)"},
		{"shape mismatch", fileOf(ex2(u8("m", "[4]", "[8,11]")), ex2Data), ErrTensorInfo, `tensor "m": data_offsets do not match shape and dtype (TensorInvalidInfo): shape [4] of U8 needs 4 bytes, data_offsets [8, 11] hold 3`},
		{"unknown dtype", fileOf(ex2(`"m":{"dtype":"F8","shape":[3],"data_offsets":[8,11]}`), ex2Data), ErrJSON, `tensor "m": invalid JSON header at header byte 124: unknown dtype "F8"`},
		{"header length past EOF", withLen(200, valid[8:]), ErrHeaderLength, "header length 200 but the file has only 179 bytes after the length"},
		{"metadata not string", fileOf(`{"__metadata__":{"epoch":3},`+ex2(ex2M)[1:], ex2Data), ErrJSON, `__metadata__ value of "epoch" must be a string, found a number`},

		// Sizes.
		{"empty file", nil, ErrHeaderTooSmall, "file has 0 bytes"},
		{"file < 8 bytes", []byte{2, 0, 0, 0, 0}, ErrHeaderTooSmall, "file has 5 bytes"},
		{"header too large", withLen(100_000_001, []byte("{}")), ErrHeaderTooLarge, "header length 100000001 exceeds 100000000"},
		{"header length 2^64-1", withLen(1<<64-1, []byte("{}")), ErrHeaderTooLarge, "header length 18446744073709551615"},
		{"header length one past EOF", withLen(3, []byte("{}")), ErrHeaderLength, "header length 3"},
		{"truncated data", valid[:186], ErrIncompleteBuffer, "(file truncated)"},
		{"no tensors, trailing bytes", fileOf("{}", []byte{0}), ErrIncompleteBuffer, "trailing bytes"},

		// Encoding and JSON syntax.
		{"non-UTF-8 header", fileOf("{\"a\xff\":{}}", nil), ErrHeaderUTF8, "invalid byte at header offset 3"},
		{"empty header", withLen(0, nil), ErrJSON, "header must be a JSON object, found end of header"},
		{"top-level array", fileOf("[]", nil), ErrJSON, "header must be a JSON object, found an array"},
		{"NUL padding", fileOf("{}\x00\x00", nil), ErrJSON, "trailing characters after the header object"},
		{"garbage after object", fileOf("{} x", nil), ErrJSON, "trailing characters"},
		{"byte order mark", fileOf("\ufeff{}", nil), ErrJSON, "header must be a JSON object"},
		{"unterminated", fileOf(`{"a":{"dtype":"U8"`, nil), ErrJSON, `expected ',' or '}' in tensor entry, found end of header`},
		{"raw control char in string", fileOf("{\"a\x01\":{}}", nil), ErrJSON, "control character 0x01"},
		{"lone surrogate", fileOf(`{"a\ud800":{}}`, nil), ErrJSON, "lone leading surrogate"},
		{"lone trailing surrogate", fileOf(`{"a\udc00":{}}`, nil), ErrJSON, "lone trailing surrogate"},
		{"bad escape", fileOf(`{"a\x":{}}`, nil), ErrJSON, `invalid escape "\\x" in string`},
		{"nesting too deep", fileOf(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":`+strings.Repeat("[", maxDepth-1)+strings.Repeat("]", maxDepth-1)+`}}`, []byte{1, 2}), ErrJSON, "nesting deeper than 127 levels"},
		{"bad hex in escape", fileOf(`{"a\u00zz":{}}`, nil), ErrJSON, "invalid hex digit in \\u escape"},
		{"truncated escape", fileOf(`{"a\u00`, nil), ErrJSON, "truncated \\u escape"},
		{"surrogate then non-surrogate", fileOf(`{"\ud800\u0041":{}}`, nil), ErrJSON, "lone leading surrogate"},
		{"unterminated key", fileOf(`{"abc`, nil), ErrJSON, "unterminated string"},
		{"unterminated escaped key", fileOf(`{"a\n`, nil), ErrJSON, "unterminated string"},
		{"missing colon", fileOf(`{"a" {}}`, nil), ErrJSON, `expected ':' after key "a"`},
		{"unquoted key", fileOf(`{a:{}}`, nil), ErrJSON, `expected a string, found 'a'`},
		{"trailing comma", fileOf(`{"__metadata__":{},}`, nil), ErrJSON, "expected a string, found '}'"},
		{"fraction without digits", fileOf(`{"m":{"x":1.,"dtype":"U8","shape":[0],"data_offsets":[0,0]}}`, nil), ErrJSON, "no digits after '.'"},
		{"exponent without digits", fileOf(`{"m":{"x":1e+,"dtype":"U8","shape":[0],"data_offsets":[0,0]}}`, nil), ErrJSON, "no digits in exponent"},
		{"lone minus", fileOf(`{"m":{"x":-,"dtype":"U8","shape":[0],"data_offsets":[0,0]}}`, nil), ErrJSON, "invalid number"},
		{"bad literal", fileOf(`{"m":{"x":nul,"dtype":"U8","shape":[0],"data_offsets":[0,0]}}`, nil), ErrJSON, "expected a JSON value, found null"},
		{"bad object in unknown field", fileOf(`{"m":{"x":{"k" 1},"dtype":"U8","shape":[0],"data_offsets":[0,0]}}`, nil), ErrJSON, `expected ':' after key "k", found a number`},
		{"metadata missing colon", fileOf(`{"__metadata__":{"k" "v"}}`, nil), ErrJSON, `expected ':' after __metadata__ key "k"`},
		{"bad number in unknown field", fileOf(`{"a":{"x":01,"dtype":"U8","shape":[0],"data_offsets":[0,0]}}`, nil), ErrJSON, "expected ',' or '}' in tensor entry"},

		// Schema.
		{"duplicate tensor", fileOf("{"+ex2Step+","+ex2E+","+ex2M+","+ex2M+"}", ex2Data), ErrJSON, `duplicate key "m"`},
		{"duplicate metadata", fileOf(`{"__metadata__":{},"__metadata__":{}}`, nil), ErrJSON, `duplicate key "__metadata__"`},
		{"duplicate metadata key", fileOf(`{"__metadata__":{"k":"a","k":"b"}}`, nil), ErrJSON, `duplicate __metadata__ key "k"`},
		{"duplicate field", fileOf(`{"m":{"dtype":"U8","dtype":"U8","shape":[0],"data_offsets":[0,0]}}`, nil), ErrJSON, `tensor "m": invalid JSON header at header byte 19: duplicate field "dtype"`},
		{"duplicate unknown field", fileOf(`{"m":{"x":1,"x":1,"dtype":"U8","shape":[0],"data_offsets":[0,0]}}`, nil), ErrJSON, `duplicate field "x"`},
		{"metadata null value", fileOf(`{"__metadata__":{"k":null}}`, nil), ErrJSON, `__metadata__ value of "k" must be a string, found null`},
		{"metadata nested", fileOf(`{"__metadata__":{"k":{}}}`, nil), ErrJSON, "found an object"},
		{"metadata array", fileOf(`{"__metadata__":[]}`, nil), ErrJSON, "__metadata__ must be an object of strings, found an array"},
		{"entry not object", fileOf(`{"m":null}`, nil), ErrJSON, `tensor "m": invalid JSON header at header byte 5: tensor entry must be a JSON object, found null`},
		{"entry as array", fileOf(`{"m":["U8",[0],[0,0]]}`, nil), ErrJSON, "tensor entry must be a JSON object, found an array"},
		{"missing shape", fileOf(`{"m":{"dtype":"U8","data_offsets":[0,0]}}`, nil), ErrJSON, `tensor "m": invalid JSON header at header byte 40: missing field "shape"`},
		{"missing dtype", fileOf(`{"m":{"shape":[0],"data_offsets":[0,0]}}`, nil), ErrJSON, `missing field "dtype"`},
		{"missing offsets", fileOf(`{"m":{"dtype":"U8","shape":[0]}}`, nil), ErrJSON, `missing field "data_offsets"`},
		{"dtype not string", fileOf(`{"m":{"dtype":8,"shape":[0],"data_offsets":[0,0]}}`, nil), ErrJSON, "dtype must be a string, found a number"},
		{"dtype lower case", fileOf(`{"m":{"dtype":"u8","shape":[0],"data_offsets":[0,0]}}`, nil), ErrJSON, `unknown dtype "u8"`},
		{"float in shape", fileOf(ex2(u8("m", "[3.0]", "[8,11]")), ex2Data), ErrJSON, `tensor "m": invalid JSON header at header byte 138: shape must hold integers, found a floating-point number`},
		{"exponent in shape", fileOf(ex2(u8("m", "[3e0]", "[8,11]")), ex2Data), ErrJSON, "found a floating-point number"},
		{"negative zero in shape", fileOf(ex2(u8("m", "[-0]", "[8,8]")), ex2Data[:8]), ErrJSON, "shape has a negative number"},
		{"string in shape", fileOf(ex2(u8("m", `["3"]`, "[8,11]")), ex2Data), ErrJSON, "shape must hold non-negative integers, found a string"},
		{"bool in shape", fileOf(ex2(u8("m", `[true]`, "[8,11]")), ex2Data), ErrJSON, "found a boolean"},
		{"leading zero", fileOf(ex2(u8("m", "[03]", "[8,11]")), ex2Data), ErrJSON, "leading zero"},
		{"shape not array", fileOf(ex2(u8("m", "3", "[8,11]")), ex2Data), ErrJSON, "shape must be an array"},
		{"integer above 2^64", fileOf(ex2(u8("m", "[18446744073709551616]", "[8,11]")), ex2Data), ErrJSON, "integer 18446744073709551616 in shape does not fit in 64 bits"},
		{"negative offset", fileOf(ex2(u8("m", "[3]", "[-1,11]")), ex2Data), ErrJSON, `tensor "m": invalid JSON header at header byte 157: data_offsets has a negative number`},
		{"three offsets", fileOf(ex2(u8("m", "[3]", "[8,11,11]")), ex2Data), ErrJSON, "data_offsets has 3 elements, want 2"},
		{"float offset", fileOf(ex2(u8("m", "[3]", "[8,11.0]")), ex2Data), ErrJSON, "data_offsets must hold integers"},

		// Offsets and sizes (§4 steps 3-6).
		{"overlap", fileOf(ex2(u8("m", "[3]", "[7,10]")), ex2Data[:10]), ErrInvalidOffset, `tensor "m": invalid data_offsets (InvalidOffset): data_offsets [7, 10] overlap the previous tensor, which ends at 8`},
		{"end before begin", fileOf(ex2(u8("m", "[3]", "[8,7]")), ex2Data), ErrInvalidOffset, "data_offsets [8, 7] end before they begin"},
		{"not starting at 0", fileOf(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, []byte{0, 0}), ErrInvalidOffset, `tensor "a"`},
		{"shape product overflow", fileOf(ex2(u8("m", "[4294967296,4294967296]", "[8,11]")), ex2Data), ErrOverflow, `tensor "m": size overflow (ValidationOverflow): element count of shape [4294967296 4294967296] exceeds 64 bits`},
		{"overflow before a zero", fileOf(ex2(u8("m", "[4294967296,4294967296,0]", "[8,8]")), ex2Data[:8]), ErrOverflow, "element count"},
		{"bit size overflow", fileOf(`{"a":{"dtype":"I64","shape":[2305843009213693952],"data_offsets":[0,0]}}`, nil), ErrOverflow, "elements of I64 exceed 64 bits"},
		{"size overflow checked before EOF", fileOf(`{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,18446744073709551615]}}`, nil), ErrTensorInfo, "needs 3 bytes"},
		{"misaligned F4", fileOf(`{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}`, []byte{0}), ErrMisaligned, `tensor "a": sub-byte tensor does not end on a byte boundary (MisalignedSlice): 3 elements of F4 are 12 bits`},
		{"F6 needs whole bytes", fileOf(`{"a":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,4]}}`, []byte{0, 0, 0, 0}), ErrTensorInfo, "needs 3 bytes"},

		// Valid files with dtypes ucp cannot hold.
		{"F4", fileOf(`{"a":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}}`, []byte{0, 0}), ErrUnsupported, `tensor "a": unsupported dtype F4 (valid safetensors, but ucp has no such element type)`},
		{"F6_E3M2", fileOf(`{"a":{"dtype":"F6_E3M2","shape":[4],"data_offsets":[0,3]}}`, []byte{0, 0, 0}), ErrUnsupported, "unsupported dtype F6_E3M2"},
		{"F8_E8M0", fileOf(`{"a":{"dtype":"F8_E8M0","shape":[1],"data_offsets":[0,1]}}`, []byte{0}), ErrUnsupported, "unsupported dtype F8_E8M0"},

		// Valid for the reference (usize), beyond ucp's int64 shapes.
		{"dimension above 2^63", fileOf(`{"a":{"dtype":"U8","shape":[9223372036854775808,0],"data_offsets":[0,0]}}`, nil), nil, `tensor "a": dimension 0 of shape [9223372036854775808 0] exceeds 2^63-1`},
	}
}

func TestReadInvalid(t *testing.T) {
	valid := fileOf(ex2(ex2M), ex2Data)
	if _, err := Read(bytes.NewReader(valid), int64(len(valid)), "x"); err != nil || len(valid) != 187 {
		t.Fatalf("base case: %d bytes, %v", len(valid), err)
	}
	for _, c := range invalidCases() {
		t.Run(c.name, func(t *testing.T) {
			f, err := Read(bytes.NewReader(c.file), int64(len(c.file)), "bad.safetensors")
			if err == nil {
				t.Fatalf("accepted: %d tensors", len(f.Tensors))
			}
			msg := err.Error()
			if c.kind != nil && !errors.Is(err, c.kind) {
				t.Errorf("error %q is not %v", msg, c.kind)
			}
			if !strings.HasPrefix(msg, "bad.safetensors: ") || !strings.Contains(msg, c.want) {
				t.Errorf("error %q\nwant it to name the file and contain %q", msg, c.want)
			}
		})
	}
}
