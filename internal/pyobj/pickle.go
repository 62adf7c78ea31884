package pyobj

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"strings"
	"unsafe"
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
	opBinPut     = 'q'
	opLongBinPut = 'r'
	opBinGet     = 'h'
	opLongBinGet = 'j'
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
	shared    map[any]bool // containers referenced more than once
	memo      map[any]int  // memo index of shared containers already written
}

// Marshal encodes v as a complete pickle (PROTO 2 ... STOP). Containers
// that v references more than once are written once and then fetched from
// the pickle memo (BINPUT/BINGET, as CPython does), so shared structure
// stays shared and costs its size once; everything else is written without
// memo opcodes.
func Marshal(v Value, ext func(e *Encoder, v Value) (bool, error)) ([]byte, error) {
	e := &Encoder{Extension: ext, shared: map[any]bool{}, memo: map[any]int{}}
	countRefs(v, map[any]bool{}, e.shared, 0)
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

// Encode appends v. It is one case per value type, as pickle.py's dispatch
// table is, and is kept whole (over 100 lines) so that table reads in one place.
func (e *Encoder) Encode(v Value) error {
	if e.depth > DefaultLimits().MaxDepth {
		return fmt.Errorf("pickle: objects nest deeper than %d levels", DefaultLimits().MaxDepth)
	}
	e.depth++
	defer func() { e.depth-- }()
	if e.Extension != nil {
		if ok, err := e.Extension(e, v); ok || err != nil {
			return err
		}
	}
	switch x := v.(type) {
	case *Object:
		if x.Class == nil {
			return fmt.Errorf("pickle: object without a class")
		}
	case Enum:
		if x.Class == nil {
			return fmt.Errorf("pickle: enum member without a class")
		}
	}
	if g := classOf(v); g != nil && strings.ContainsAny(g.Module+g.Name, "\n") {
		return fmt.Errorf("pickle: cannot encode global %q: GLOBAL names end at a newline", g.String())
	}
	id, isContainer := identity(v)
	if isContainer {
		if n, ok := e.memo[id]; ok {
			e.get(n)
			return nil
		}
	}
	// put memoizes v right after the opcode that creates it, before its
	// items, as CPython does.
	put := func() {
		if isContainer && e.shared[id] {
			n := len(e.memo)
			e.memo[id] = n
			if n < 256 {
				e.buf = append(e.buf, opBinPut, byte(n))
			} else {
				e.buf = append(e.buf, opLongBinPut)
				e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(n))
			}
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
		put()
	case float64:
		e.buf = append(e.buf, opBinFloat)
		e.buf = binary.BigEndian.AppendUint64(e.buf, math.Float64bits(x))
	case string:
		e.str(x)
		put()
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
		put()
	case Tuple:
		if err := e.tuple(x); err != nil {
			return err
		}
		put()
	case *List:
		e.buf = append(e.buf, opEmptyList)
		put()
		return e.batch(len(x.Items), opAppends, func(i int) error { return e.Encode(x.Items[i]) })
	case *Dict:
		if x.Kind == OrderedDict {
			e.Global("collections", "OrderedDict")
			e.buf = append(e.buf, opEmptyTuple, opReduce)
		} else {
			e.buf = append(e.buf, opEmptyDict)
		}
		put()
		if err := e.batch(x.Len(), opSetItems, func(i int) error {
			k, v := x.Item(i)
			if err := e.Encode(k); err != nil {
				return err
			}
			return e.Encode(v)
		}); err != nil {
			return err
		}
		if x.Attrs != nil {
			// Attributes follow the items, as CPython's save_reduce orders them.
			if err := e.Encode(x.Attrs); err != nil {
				return err
			}
			e.buf = append(e.buf, opBuild)
		}
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
		put()
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
		put()
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

// classOf returns the global that encoding v writes with GLOBAL.
func classOf(v Value) *Global {
	switch x := v.(type) {
	case *Global:
		return x
	case *Object:
		return x.Class
	case Enum:
		return x.Class
	}
	return nil
}

func (e *Encoder) get(n int) {
	if n < 256 {
		e.buf = append(e.buf, opBinGet, byte(n))
	} else {
		e.buf = append(e.buf, opLongBinGet)
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(n))
	}
}

// identity returns the key under which a value is memoized: a container's
// pointer, a tuple's backing array, or the bytes behind a long string, bytes
// or big int (a pickle can reference one long string a million times).
func identity(v Value) (any, bool) {
	switch x := v.(type) {
	case *List, *Dict, *Set, *Object:
		return x, true
	case Tuple:
		if len(x) > 0 {
			return tupleID{&x[0], len(x)}, true
		}
	case string:
		if len(x) >= memoMinBytes {
			return scalarID{unsafe.StringData(x), len(x)}, true
		}
	case Bytes:
		if len(x) >= memoMinBytes {
			return scalarID{&x[0], len(x)}, true
		}
	case *big.Int:
		if x.BitLen() >= 8*memoMinBytes {
			return x, true
		}
	}
	return nil, false
}

// memoMinBytes is the size from which shared strings, bytes and ints are
// memoized: short ones cost less to repeat than to fetch.
const memoMinBytes = 64

type scalarID struct {
	p *byte
	n int
}

// countRefs marks in shared the containers reachable from v more than
// once. It visits each container once, so it is linear in the number of
// distinct containers; too deep trees are left for Encode to reject.
func countRefs(v Value, seen, shared map[any]bool, depth int) {
	id, ok := identity(v)
	if !ok || depth > DefaultLimits().MaxDepth+1 {
		return
	}
	if seen[id] {
		shared[id] = true
		return
	}
	seen[id] = true
	var kids []Value
	switch x := v.(type) {
	case *List:
		kids = x.Items
	case Tuple:
		kids = x
	case *Set:
		kids = x.Items
	case *Dict:
		kids = append(append([]Value{}, x.keys...), x.vals...)
		if x.Attrs != nil {
			kids = append(kids, x.Attrs)
		}
	case *Object:
		kids = append(append([]Value{}, x.Args...), x.State)
	}
	for _, k := range kids {
		countRefs(k, seen, shared, depth+1)
	}
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
