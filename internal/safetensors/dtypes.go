package safetensors

import "github.com/ucp-project/ucp/internal/dtype"

// refDType is a dtype of the reference implementation, numbered in the
// order of its Rust enum: the writer sorts by this rank (descending), so
// the order is part of the byte-exact output.
type refDType uint8

var refDTypes = [...]struct {
	name string
	bits uint64
}{
	{"BOOL", 8},
	{"F4", 4},
	{"F6_E2M3", 6},
	{"F6_E3M2", 6},
	{"U8", 8},
	{"I8", 8},
	{"F8_E5M2", 8},
	{"F8_E4M3", 8},
	{"F8_E8M0", 8},
	{"F8_E4M3FNUZ", 8},
	{"F8_E5M2FNUZ", 8},
	{"I16", 16},
	{"U16", 16},
	{"F16", 16},
	{"BF16", 16},
	{"I32", 32},
	{"U32", 32},
	{"F32", 32},
	{"C64", 64},
	{"F64", 64},
	{"I64", 64},
	{"U64", 64},
}

func refDTypeByName(s string) (refDType, bool) {
	for i, d := range refDTypes {
		if d.name == s {
			return refDType(i), true
		}
	}
	return 0, false
}

func (d refDType) String() string { return refDTypes[d].name }
func (d refDType) bits() uint64   { return refDTypes[d].bits }

// rankOf returns the reference enum position of a ucp dtype, and whether
// safetensors can store it.
func rankOf(d dtype.DType) (refDType, bool) {
	name := d.SafetensorsName()
	if name == "" {
		return 0, false
	}
	return refDTypeByName(name)
}
