package pyobj

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
)

// Pickle opcodes used by the encoder (protocol 2, which every torch.load
// accepts, weights_only included).
const (
	opMark       = '('
	opStop       = '.'
	opBinInt     = 'J'
	opBinInt1    = 'K'
	opBinInt2    = 'M'
	opNone       = 'N'
	opBinPersID  = 'Q'
	opReduce     = 'R'
	opBinUnicode = 'X'
	opAppends    = 'e'
	opBuild      = 'b'
	opGlobal     = 'c'
	opEmptyDict  = '}'
	opEmptyList  = ']'
	opTuple      = 't'
	opEmptyTuple = ')'
	opSetItems   = 'u'
	opBinFloat   = 'G'
	opProto      = 0x80
	opNewObj     = 0x81
	opTuple1     = 0x85
	opTuple2     = 0x86
	opTuple3     = 0x87
	opNewTrue    = 0x88
	opNewFalse   = 0x89
	opLong1      = 0x8a
	opLong4      = 0x8b
)

// batchSize is how many items CPython puts in one APPENDS/SETITEMS.
const batchSize = 1000

// Encoder writes a protocol-2 pickle. Values this package does not model
// are passed to Extension.
type Encoder struct {
	buf []byte
	// Extension encodes values of other packages (torch tensors). It
	// returns false for values it does not know.
	Extension func(e *Encoder, v Value) (bool, error)
	depth     int
}

// Marshal encodes v as a complete pickle (PROTO 2 ... STOP).
func Marshal(v Value, ext func(e *Encoder, v Value) (bool, error)) ([]byte, error) {
	e := &Encoder{Extension: ext}
	e.buf = append(e.buf, opProto, 2)
	if err := e.Encode(v); err != nil {
		return nil, err
	}
	e.buf = append(e.buf, opStop)
	return e.buf, nil
}

// Op appends raw opcode bytes.
func (e *Encoder) Op(b ...byte) { e.buf = append(e.buf, b...) }

// Global writes a GLOBAL opcode.
func (e *Encoder) Global(module, name string) {
	e.buf = append(e.buf, opGlobal)
	e.buf = append(e.buf, module...)
	e.buf = append(e.buf, '\n')
	e.buf = append(e.buf, name...)
	e.buf = append(e.buf, '\n')
}

// Encode appends v.
func (e *Encoder) Encode(v Value) error {
	if e.depth > DefaultLimits.MaxDepth {
		return fmt.Errorf("pickle: objects nest deeper than %d levels", DefaultLimits.MaxDepth)
	}
	e.depth++
	defer func() { e.depth-- }()
	if e.Extension != nil {
		if ok, err := e.Extension(e, v); ok || err != nil {
			return err
		}
	}
	switch x := v.(type) {
	case nil:
		e.buf = append(e.buf, opNone)
	case bool:
		if x {
			e.buf = append(e.buf, opNewTrue)
		} else {
			e.buf = append(e.buf, opNewFalse)
		}
	case int:
		e.int(int64(x))
	case int64:
		e.int(x)
	case *big.Int:
		e.bigInt(x)
	case float64:
		e.buf = append(e.buf, opBinFloat)
		e.buf = binary.BigEndian.AppendUint64(e.buf, math.Float64bits(x))
	case string:
		e.str(x)
	case Bytes:
		// Protocol 2 has no bytes opcode; CPython writes _codecs.encode.
		e.Global("_codecs", "encode")
		rs := make([]rune, len(x))
		for i, b := range x {
			rs[i] = rune(b)
		}
		e.str(string(rs))
		e.str("latin1")
		e.buf = append(e.buf, opTuple2, opReduce)
	case Tuple:
		return e.tuple(x)
	case *List:
		e.buf = append(e.buf, opEmptyList)
		return e.batch(len(x.Items), opAppends, func(i int) error { return e.Encode(x.Items[i]) })
	case *Dict:
		if x.Kind == OrderedDict {
			e.Global("collections", "OrderedDict")
			e.buf = append(e.buf, opEmptyTuple, opReduce)
		} else {
			e.buf = append(e.buf, opEmptyDict)
		}
		return e.batch(x.Len(), opSetItems, func(i int) error {
			k, v := x.Item(i)
			if err := e.Encode(k); err != nil {
				return err
			}
			return e.Encode(v)
		})
	case *Set:
		name := "set"
		if x.Frozen {
			name = "frozenset"
		}
		e.Global("__builtin__", name)
		if err := e.Encode(&List{Items: x.Items}); err != nil {
			return err
		}
		e.buf = append(e.buf, opTuple1, opReduce)
	case *Global:
		e.Global(x.Module, x.Name)
	case DType:
		e.Global("torch", x.DType.String())
	case Size:
		e.Global("torch", "Size")
		t := make(Tuple, len(x))
		for i, d := range x {
			t[i] = d
		}
		if err := e.tuple(t); err != nil {
			return err
		}
		e.buf = append(e.buf, opTuple1, opReduce)
	case Enum:
		if x.ByName {
			e.Global("__builtin__", "getattr")
			e.Global(x.Class.Module, x.Class.Name)
			e.str(x.Name)
			e.buf = append(e.buf, opTuple2, opReduce)
		} else {
			e.Global(x.Class.Module, x.Class.Name)
			if err := e.Encode(x.Value); err != nil {
				return err
			}
			e.buf = append(e.buf, opTuple1, opReduce)
		}
	case *Object:
		e.Global(x.Class.Module, x.Class.Name)
		if err := e.tuple(Tuple(x.Args)); err != nil {
			return err
		}
		if x.Via == ByNewObj {
			e.buf = append(e.buf, opNewObj)
		} else {
			e.buf = append(e.buf, opReduce)
		}
		if x.Built {
			if err := e.Encode(x.State); err != nil {
				return err
			}
			e.buf = append(e.buf, opBuild)
		}
	default:
		return fmt.Errorf("pickle: cannot encode %T", v)
	}
	return nil
}

func (e *Encoder) int(x int64) {
	switch {
	case x >= 0 && x < 1<<8:
		e.buf = append(e.buf, opBinInt1, byte(x))
	case x >= 0 && x < 1<<16:
		e.buf = append(e.buf, opBinInt2, byte(x), byte(x>>8))
	case x >= math.MinInt32 && x <= math.MaxInt32:
		e.buf = append(e.buf, opBinInt)
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(int32(x)))
	default:
		e.bigInt(big.NewInt(x))
	}
}

// bigInt writes LONG1/LONG4 with CPython's minimal two's-complement bytes.
func (e *Encoder) bigInt(x *big.Int) {
	var b []byte
	if x.Sign() != 0 {
		nbytes := x.BitLen()/8 + 1
		// Two's complement of x in nbytes bytes, little-endian.
		m := new(big.Int).Lsh(big.NewInt(1), uint(8*nbytes))
		v := new(big.Int).Set(x)
		if v.Sign() < 0 {
			v.Add(v, m)
		}
		be := v.FillBytes(make([]byte, nbytes))
		b = make([]byte, nbytes)
		for i := range be {
			b[i] = be[nbytes-1-i]
		}
		// CPython drops a redundant sign byte for negatives like -128.
		if x.Sign() < 0 && nbytes > 1 && b[nbytes-1] == 0xff && b[nbytes-2]&0x80 != 0 {
			b = b[:nbytes-1]
		}
	}
	if len(b) < 256 {
		e.buf = append(e.buf, opLong1, byte(len(b)))
	} else {
		e.buf = append(e.buf, opLong4)
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(len(b)))
	}
	e.buf = append(e.buf, b...)
}

func (e *Encoder) str(s string) {
	e.buf = append(e.buf, opBinUnicode)
	e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(len(s)))
	e.buf = append(e.buf, s...)
}

func (e *Encoder) tuple(t Tuple) error {
	if len(t) > 3 {
		e.buf = append(e.buf, opMark)
	}
	for _, v := range t {
		if err := e.Encode(v); err != nil {
			return err
		}
	}
	switch len(t) {
	case 0:
		e.buf = append(e.buf, opEmptyTuple)
	case 1:
		e.buf = append(e.buf, opTuple1)
	case 2:
		e.buf = append(e.buf, opTuple2)
	case 3:
		e.buf = append(e.buf, opTuple3)
	default:
		e.buf = append(e.buf, opTuple)
	}
	return nil
}

// batch writes n items as MARK ... op groups of at most batchSize.
func (e *Encoder) batch(n int, op byte, item func(int) error) error {
	for start := 0; start < n; start += batchSize {
		e.buf = append(e.buf, opMark)
		for i := start; i < min(n, start+batchSize); i++ {
			if err := item(i); err != nil {
				return err
			}
		}
		e.buf = append(e.buf, op)
	}
	return nil
}
