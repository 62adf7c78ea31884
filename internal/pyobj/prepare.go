package pyobj

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// prepare checks the shape of a pickle that Scan accepted and returns the
// bytes gopickle's VM runs. It simulates the VM's stack by counts only:
// stack underflows, pops to a MARK that is not there, odd key/value
// counts, memo keys never stored and too many nested MARKs are errors here,
// with their byte offsets, so the VM only ever sees well-formed streams.
// Protocol 0/1 text opcodes whose arguments gopickle does not decode as
// CPython does (escapes in STRING and UNICODE, big INT, FLOAT spellings) are
// rewritten into their binary equivalents; pickles of protocol 2 and later
// (every torch.save) come back unchanged.
//
// One loop with one case per opcode family, kept whole (over 100 lines)
// like the VM it guards.
func prepare(data []byte, lim Limits) ([]byte, error) {
	s := &shape{memo: map[uint64]bool{}, maxMarks: 4*lim.MaxDepth + 16}
	var out []byte // nil until a rewrite is needed
	pos := 0
	for pos < len(data) {
		op := data[pos]
		info := opcodes[op]
		at := pos
		end := opEnd(data, pos)
		s.name, s.at = info.name, at
		arg := data[pos+1 : end]
		var repl []byte
		var err error
		switch op {
		case '(':
			err = s.mark()
		case '.':
			err = s.need(1)
		case '0':
			if s.depth > 0 {
				s.depth--
			} else {
				_, err = s.popMark()
			}
		case '1':
			_, err = s.popMark()
		case '2', 0x98: // DUP, READONLY_BUFFER
			err = s.need(1)
			if op == '2' {
				s.depth++
			}
		case 'h', 'j', 'g': // BINGET, LONG_BINGET, GET
			var k uint64
			if k, err = memoIndex(op, arg); err == nil {
				if !s.memo[k] {
					err = s.errf("memo key %d was never stored", k)
				}
				s.depth++
			}
		case 'q', 'r', 'p': // BINPUT, LONG_BINPUT, PUT
			var k uint64
			if k, err = memoIndex(op, arg); err == nil {
				if err = s.need(1); err == nil {
					s.memo[k] = true
				}
			}
		case 0x94: // MEMOIZE
			if err = s.need(1); err == nil {
				s.memo[uint64(len(s.memo))] = true
			}
		case 'Q', 0x97: // BINPERSID replaces its argument; NEXT_BUFFER pushes
			if op == 'Q' {
				err = s.need(1)
			} else {
				s.depth++
			}
		case 'R', 'b', 0x81, 0x93, 'a': // REDUCE, BUILD, NEWOBJ, STACK_GLOBAL, APPEND: 2 -> 1
			err = s.pop(2, 1)
		case 0x92: // NEWOBJ_EX: 3 -> 1
			err = s.pop(3, 1)
		case 's': // SETITEM: 3 -> 1
			err = s.pop(3, 1)
		case 'e', 'u', 0x90: // APPENDS, SETITEMS, ADDITEMS: pop to mark onto the item below
			var n int
			if n, err = s.popMark(); err == nil {
				if op == 'u' && n%2 != 0 {
					err = s.errf("odd number of items (%d) for key/value pairs", n)
				} else {
					err = s.need(1)
				}
			}
		case 't', 'l', 'd', 0x91, 'i': // TUPLE, LIST, DICT, FROZENSET, INST: pop to mark, push 1
			var n int
			if n, err = s.popMark(); err == nil {
				if op == 'd' && n%2 != 0 {
					err = s.errf("odd number of items (%d) for key/value pairs", n)
				}
				s.depth++
			}
		case 'o': // OBJ: the class and its arguments are above the mark
			var n int
			if n, err = s.popMark(); err == nil {
				if n == 0 {
					err = s.errf("no class above the MARK")
				}
				s.depth++
			}
		case 0x85, 0x86, 0x87: // TUPLE1..3
			err = s.pop(int(op-0x84), 1)
		case 0x80, 0x95: // PROTO, FRAME
		case 0x8a, 0x8b: // LONG1, LONG4
			s.depth++
			payload := data[at+2 : end]
			if op == 0x8b {
				payload = data[at+5 : end]
			}
			switch {
			case len(payload) == 0: // 0, which gopickle's decoder cannot read
				repl = []byte{opBinInt1, 0}
			case len(payload) > 8: // gopickle decodes big ints in quadratic time
				repl = internalCall("long", payload)
			}
		case 'B', 'C', 0x8e, 0x96: // BINBYTES, SHORT_BINBYTES, BINBYTES8, BYTEARRAY8
			// gopickle pushes a []byte, which cannot be a set item or an
			// OrderedDict key; protocol 2's _codecs.encode form makes a
			// boxed value that can.
			s.depth++
			repl = bytesCall(data[at:end])
		case 'I', 'L', 'F', 'S', 'V':
			s.depth++
			repl, err = rewriteText(op, arg)
			if err != nil {
				err = s.errf("%w", err)
			}
		default: // everything else pushes one value
			s.depth++
		}
		if err != nil {
			return nil, err
		}
		if repl != nil && out == nil {
			// Rewriting changes lengths, so FRAMEs (optional in the
			// format) no longer fit: the rewritten stream has none.
			out = withoutFrames(make([]byte, 0, len(data)), data[:at])
		}
		switch {
		case out == nil:
		case repl != nil:
			out = append(out, repl...)
		case op != 0x95:
			out = append(out, data[at:end]...)
		}
		pos = end
	}
	if out != nil {
		return out, nil
	}
	return data, nil
}

// shape is the VM's stack by counts: items in the current MARK frame and
// the counts saved by each open MARK.
type shape struct {
	depth    int
	frames   []int
	memo     map[uint64]bool
	maxMarks int
	name     string
	at       int
}

func (s *shape) errf(format string, args ...any) error {
	return fmt.Errorf("pickle: %s at byte %d: %w", s.name, s.at, fmt.Errorf(format, args...))
}

func (s *shape) need(k int) error {
	if s.depth < k {
		return s.errf("stack underflow")
	}
	return nil
}

// pop takes k items of the current frame and pushes back r.
func (s *shape) pop(k, r int) error {
	if err := s.need(k); err != nil {
		return err
	}
	s.depth += r - k
	return nil
}

func (s *shape) mark() error {
	if len(s.frames) >= s.maxMarks {
		return s.errf("more than %d nested MARKs", s.maxMarks)
	}
	s.frames = append(s.frames, s.depth)
	s.depth = 0
	return nil
}

// popMark drops the current frame and returns how many items it held.
func (s *shape) popMark() (int, error) {
	if len(s.frames) == 0 {
		return 0, s.errf("no MARK to pop to")
	}
	n := s.depth
	s.depth = s.frames[len(s.frames)-1]
	s.frames = s.frames[:len(s.frames)-1]
	return n, nil
}

// withoutFrames appends the opcodes of data to out, FRAMEs left out.
func withoutFrames(out, data []byte) []byte {
	for pos := 0; pos < len(data); {
		end := opEnd(data, pos)
		if data[pos] != 0x95 {
			out = append(out, data[pos:end]...)
		}
		pos = end
	}
	return out
}

// opEnd returns the offset after the opcode at pos (Scan checked it fits).
func opEnd(data []byte, pos int) int {
	info := opcodes[data[pos]]
	p := pos + 1
	switch info.kind {
	case argFixed:
		return p + info.n
	case argLen1:
		return p + 1 + int(data[p])
	case argLen4, argLenS4:
		return p + 4 + int(binary.LittleEndian.Uint32(data[p:]))
	case argLen8:
		return p + 8 + int(binary.LittleEndian.Uint64(data[p:]))
	case argFrame:
		return p + 8
	case argLine:
		return p + indexNL(data[p:]) + 1
	case argLine2:
		p += indexNL(data[p:]) + 1
		return p + indexNL(data[p:]) + 1
	}
	return p
}

func indexNL(b []byte) int {
	for i, c := range b {
		if c == '\n' {
			return i
		}
	}
	return len(b)
}

func memoIndex(op byte, arg []byte) (uint64, error) {
	switch op {
	case 'h', 'q':
		return uint64(arg[0]), nil
	case 'j', 'r':
		return uint64(binary.LittleEndian.Uint32(arg)), nil
	}
	txt := strings.TrimSuffix(string(arg), "\n")
	k, err := strconv.ParseUint(txt, 10, 63)
	if err != nil {
		return 0, fmt.Errorf("pickle: bad memo index %q", txt)
	}
	return k, nil
}

// rewriteText turns a protocol 0/1 text opcode into binary opcodes that
// push the value CPython would.
func rewriteText(op byte, arg []byte) ([]byte, error) {
	txt := strings.TrimSuffix(string(arg), "\n")
	e := &Encoder{}
	switch op {
	case 'I':
		switch txt {
		case "00":
			return []byte{opNewFalse}, nil
		case "01":
			return []byte{opNewTrue}, nil
		}
		v, err := parseBigInt(txt)
		if err != nil {
			return nil, err
		}
		e.anyInt(v)
	case 'L':
		v, err := parseBigInt(strings.TrimSuffix(txt, "L"))
		if err != nil {
			return nil, err
		}
		e.anyInt(v)
	case 'F':
		f, err := strconv.ParseFloat(strings.TrimSpace(txt), 64)
		if err != nil && !isRangeErr(err) {
			return nil, fmt.Errorf("bad float %q", txt)
		}
		if math.IsNaN(f) { // CPython's float('nan') is the quiet NaN with no payload
			f = math.Float64frombits(0x7ff8000000000000 | uint64(boolBit(strings.HasPrefix(strings.TrimSpace(txt), "-")))<<63)
		}
		e.buf = append(e.buf, opBinFloat)
		e.buf = binary.BigEndian.AppendUint64(e.buf, math.Float64bits(f))
	case 'S':
		if len(txt) < 2 || (txt[0] != '\'' && txt[0] != '"') || txt[len(txt)-1] != txt[0] {
			return nil, fmt.Errorf("the STRING argument must be quoted")
		}
		b, err := escapeDecode(txt[1 : len(txt)-1])
		if err != nil {
			return nil, err
		}
		e.str(string(b))
	case 'V':
		s, err := rawUnicodeDecode(txt)
		if err != nil {
			return nil, err
		}
		e.str(s)
	}
	return e.buf, nil
}

// anyInt writes v as BININT* when it fits in 64 bits, else LONG1/LONG4
// (never an empty LONG1, which gopickle cannot decode).
func (e *Encoder) anyInt(v *big.Int) {
	if v.IsInt64() {
		e.int(v.Int64())
		return
	}
	e.bigInt(v)
}

// internalModule names the pseudo-module of calls that prepare inserts:
// findClass gives them their meaning and does not report them as globals.
const internalModule = "__ucp__"

// internalCall is GLOBAL __ucp__.name applied to the payload as a latin-1 string.
func internalCall(name string, payload []byte) []byte {
	e := &Encoder{}
	e.Global(internalModule, name)
	e.str(latin1(payload))
	e.buf = append(e.buf, opTuple1, opReduce)
	return e.buf
}

func latin1(b []byte) string {
	rs := make([]rune, len(b))
	for i, c := range b {
		rs[i] = rune(c)
	}
	return string(rs)
}

// decodeLong decodes a little-endian two's-complement integer (LONG1/LONG4)
// in linear time.
func decodeLong(b []byte) Value {
	if len(b) == 0 {
		return int64(0)
	}
	be := make([]byte, len(b))
	for i := range b {
		be[len(b)-1-i] = b[i]
	}
	x := new(big.Int).SetBytes(be)
	if b[len(b)-1]&0x80 != 0 {
		x.Sub(x, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	if x.IsInt64() {
		return x.Int64()
	}
	return x
}

// bytesCall rewrites a bytes opcode as _codecs.encode('latin-1 text', 'latin1').
func bytesCall(op []byte) []byte {
	var payload []byte
	switch op[0] {
	case 'B':
		payload = op[5:]
	case 'C':
		payload = op[2:]
	default:
		payload = op[9:]
	}
	e := &Encoder{}
	e.Global("_codecs", "encode")
	e.str(latin1(payload))
	e.str("latin1")
	e.buf = append(e.buf, opTuple2, opReduce)
	return e.buf
}

func boolBit(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func isRangeErr(err error) bool {
	ne, ok := err.(*strconv.NumError)
	return ok && ne.Err == strconv.ErrRange
}

func parseBigInt(s string) (*big.Int, error) {
	s = strings.TrimSpace(s)
	if len(s) > 4300 { // CPython's default int string conversion limit
		return nil, fmt.Errorf("integer of %d digits", len(s))
	}
	v, ok := new(big.Int).SetString(s, 10)
	if !ok {
		return nil, fmt.Errorf("bad integer %q", s)
	}
	return v, nil
}
