// Package dtype names the element types that PyTorch and safetensors store,
// their sizes, their spellings in each format, and exact conversion to float32.
package dtype

import (
	"fmt"
	"strings"
)

// DType is an element type of a stored tensor.
type DType uint8

// The element types ucp knows. Invalid is the zero value so that a missing
// dtype is never mistaken for a real one.
const (
	Invalid DType = iota
	Float32
	Float64
	Float16
	BFloat16
	Int8
	Int16
	Int32
	Int64
	Uint8
	Bool
	Complex64
	Complex128
	Uint16
	Uint32
	Uint64
	Float8E4M3FN
	Float8E5M2
	Float8E4M3FNUZ
	Float8E5M2FNUZ
	numDTypes
)

type info struct {
	name        string // torch name without "torch."
	size        int    // bytes per element
	storage     string // legacy typed storage class, "" when torch has none
	safetensors string // safetensors dtype name, "" when the format has none
}

var infos = [numDTypes]info{
	Invalid:        {"invalid", 0, "", ""},
	Float32:        {"float32", 4, "FloatStorage", "F32"},
	Float64:        {"float64", 8, "DoubleStorage", "F64"},
	Float16:        {"float16", 2, "HalfStorage", "F16"},
	BFloat16:       {"bfloat16", 2, "BFloat16Storage", "BF16"},
	Int8:           {"int8", 1, "CharStorage", "I8"},
	Int16:          {"int16", 2, "ShortStorage", "I16"},
	Int32:          {"int32", 4, "IntStorage", "I32"},
	Int64:          {"int64", 8, "LongStorage", "I64"},
	Uint8:          {"uint8", 1, "ByteStorage", "U8"},
	Bool:           {"bool", 1, "BoolStorage", "BOOL"},
	Complex64:      {"complex64", 8, "ComplexFloatStorage", "C64"},
	Complex128:     {"complex128", 16, "ComplexDoubleStorage", ""},
	Uint16:         {"uint16", 2, "", "U16"},
	Uint32:         {"uint32", 4, "", "U32"},
	Uint64:         {"uint64", 8, "", "U64"},
	Float8E4M3FN:   {"float8_e4m3fn", 1, "", "F8_E4M3"},
	Float8E5M2:     {"float8_e5m2", 1, "", "F8_E5M2"},
	Float8E4M3FNUZ: {"float8_e4m3fnuz", 1, "", "F8_E4M3FNUZ"},
	Float8E5M2FNUZ: {"float8_e5m2fnuz", 1, "", "F8_E5M2FNUZ"},
}

// torch accepts these older spellings as attributes of the torch module.
var torchAliases = map[string]DType{
	"float": Float32, "double": Float64, "half": Float16,
	"short": Int16, "int": Int32, "long": Int64,
	"cfloat": Complex64, "cdouble": Complex128,
}

// String returns torch's name for d, such as "float32" or "bfloat16".
func (d DType) String() string {
	if d >= numDTypes {
		return fmt.Sprintf("dtype(%d)", uint8(d))
	}
	return infos[d].name
}

// Size returns the number of bytes of one element (0 for Invalid).
func (d DType) Size() int {
	if d >= numDTypes {
		return 0
	}
	return infos[d].size
}

// Valid reports whether d is a known element type.
func (d DType) Valid() bool { return d > Invalid && d < numDTypes }

// IsFloat reports whether d is a real floating-point type.
func (d DType) IsFloat() bool {
	switch d {
	case Float32, Float64, Float16, BFloat16, Float8E4M3FN, Float8E5M2, Float8E4M3FNUZ, Float8E5M2FNUZ:
		return true
	}
	return false
}

// StorageClass returns the name of torch's typed storage class for d
// ("FloatStorage"), or "" for dtypes that only exist as UntypedStorage.
func (d DType) StorageClass() string {
	if d >= numDTypes {
		return ""
	}
	return infos[d].storage
}

// SafetensorsName returns the safetensors spelling ("F32"), or "" if the
// format cannot hold d.
func (d DType) SafetensorsName() string {
	if d >= numDTypes {
		return ""
	}
	return infos[d].safetensors
}

// FromStorageClass maps a typed storage class name ("HalfStorage") to its dtype.
func FromStorageClass(class string) (DType, bool) {
	for d := Float32; d < numDTypes; d++ {
		if infos[d].storage != "" && infos[d].storage == class {
			return d, true
		}
	}
	return Invalid, false
}

// FromTorchName maps a torch dtype attribute name ("float32", "half",
// with or without a "torch." prefix) to its dtype.
func FromTorchName(name string) (DType, bool) {
	name = strings.TrimPrefix(name, "torch.")
	for d := Float32; d < numDTypes; d++ {
		if infos[d].name == name {
			return d, true
		}
	}
	d, ok := torchAliases[name]
	return d, ok
}

// FromSafetensors maps a safetensors dtype name ("BF16") to its dtype.
func FromSafetensors(name string) (DType, bool) {
	for d := Float32; d < numDTypes; d++ {
		if infos[d].safetensors != "" && infos[d].safetensors == name {
			return d, true
		}
	}
	return Invalid, false
}

// Parse accepts any of the spellings above: torch names, storage classes
// and safetensors names. It is meant for command-line flags.
func Parse(s string) (DType, error) {
	if d, ok := FromTorchName(s); ok {
		return d, nil
	}
	if d, ok := FromSafetensors(strings.ToUpper(s)); ok {
		return d, nil
	}
	if d, ok := FromStorageClass(s); ok {
		return d, nil
	}
	return Invalid, fmt.Errorf("unknown dtype %q", s)
}
