package pyobj

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrTruncated is wrapped by Scan's errors for pickles that need more bytes
// than were given, so that a reader with a window can read further.
var ErrTruncated = errors.New("pickle: truncated")

// TruncatedError is how Scan reports a pickle that runs past the bytes it
// was given (errors.Is(err, ErrTruncated) holds). Need, when not zero, is
// the size from the start of data that the failing opcode requires, so that
// a caller reading a window of a file can tell whether reading further can
// help or the pickle claims more than the file has.
type TruncatedError struct {
	Need uint64
	msg  string
}

func (e *TruncatedError) Error() string { return e.msg }

// Is makes errors.Is(err, ErrTruncated) true.
func (e *TruncatedError) Is(target error) bool { return target == ErrTruncated }

// argKind is how an opcode's argument is laid out after the opcode byte.
type argKind uint8

const (
	argNone  argKind = iota
	argFixed         // n fixed bytes
	argLen1          // u8 length, then that many bytes
	argLen4          // u32le length, then that many bytes
	argLenS4         // s32le length (negative is invalid), then that many bytes
	argLen8          // u64le length, then that many bytes
	argLine          // bytes up to and including '\n'
	argLine2         // two such lines
	argFrame         // u64le frame length that must fit in the rest
)

type opInfo struct {
	name string
	kind argKind
	n    int
}

// opcodes is the pickle opcode table (protocols 0-5), as in CPython's
// pickletools; an array, not a map: Scan looks up every opcode of every
// pickle. Unknown opcodes have no name.
var opcodes = [256]opInfo{
	'(': {"MARK", argNone, 0}, '.': {"STOP", argNone, 0}, '0': {"POP", argNone, 0},
	'1': {"POP_MARK", argNone, 0}, '2': {"DUP", argNone, 0}, 'F': {"FLOAT", argLine, 0},
	'I': {"INT", argLine, 0}, 'J': {"BININT", argFixed, 4}, 'K': {"BININT1", argFixed, 1},
	'L': {"LONG", argLine, 0}, 'M': {"BININT2", argFixed, 2}, 'N': {"NONE", argNone, 0},
	'P': {"PERSID", argLine, 0}, 'Q': {"BINPERSID", argNone, 0}, 'R': {"REDUCE", argNone, 0},
	'S': {"STRING", argLine, 0}, 'T': {"BINSTRING", argLenS4, 0}, 'U': {"SHORT_BINSTRING", argLen1, 0},
	'V': {"UNICODE", argLine, 0}, 'X': {"BINUNICODE", argLen4, 0}, 'a': {"APPEND", argNone, 0},
	'b': {"BUILD", argNone, 0}, 'c': {"GLOBAL", argLine2, 0}, 'd': {"DICT", argNone, 0},
	'}': {"EMPTY_DICT", argNone, 0}, 'e': {"APPENDS", argNone, 0}, 'g': {"GET", argLine, 0},
	'h': {"BINGET", argFixed, 1}, 'i': {"INST", argLine2, 0}, 'j': {"LONG_BINGET", argFixed, 4},
	'l': {"LIST", argNone, 0}, ']': {"EMPTY_LIST", argNone, 0}, 'o': {"OBJ", argNone, 0},
	'p': {"PUT", argLine, 0}, 'q': {"BINPUT", argFixed, 1}, 'r': {"LONG_BINPUT", argFixed, 4},
	's': {"SETITEM", argNone, 0}, 't': {"TUPLE", argNone, 0}, ')': {"EMPTY_TUPLE", argNone, 0},
	'u': {"SETITEMS", argNone, 0}, 'G': {"BINFLOAT", argFixed, 8},
	0x80: {"PROTO", argFixed, 1}, 0x81: {"NEWOBJ", argNone, 0}, 0x82: {"EXT1", argFixed, 1},
	0x83: {"EXT2", argFixed, 2}, 0x84: {"EXT4", argFixed, 4}, 0x85: {"TUPLE1", argNone, 0},
	0x86: {"TUPLE2", argNone, 0}, 0x87: {"TUPLE3", argNone, 0}, 0x88: {"NEWTRUE", argNone, 0},
	0x89: {"NEWFALSE", argNone, 0}, 0x8a: {"LONG1", argLen1, 0}, 0x8b: {"LONG4", argLenS4, 0},
	'B': {"BINBYTES", argLen4, 0}, 'C': {"SHORT_BINBYTES", argLen1, 0},
	0x8c: {"SHORT_BINUNICODE", argLen1, 0}, 0x8d: {"BINUNICODE8", argLen8, 0},
	0x8e: {"BINBYTES8", argLen8, 0}, 0x8f: {"EMPTY_SET", argNone, 0}, 0x90: {"ADDITEMS", argNone, 0},
	0x91: {"FROZENSET", argNone, 0}, 0x92: {"NEWOBJ_EX", argNone, 0}, 0x93: {"STACK_GLOBAL", argNone, 0},
	0x94: {"MEMOIZE", argNone, 0}, 0x95: {"FRAME", argFrame, 0}, 0x96: {"BYTEARRAY8", argLen8, 0},
	0x97: {"NEXT_BUFFER", argNone, 0}, 0x98: {"READONLY_BUFFER", argNone, 0},
}

// Limits bound the work an untrusted pickle can cause.
type Limits struct {
	MaxOps   int // opcodes in one pickle
	MaxDepth int // nesting of containers in the decoded value
	MaxLine  int // bytes in one text-argument line
	// MaxBytes bounds Scan's estimate of the memory that decoding takes;
	// <= 0: Unpickle uses SizeBudget of the pickle's size, Scan no bound.
	MaxBytes int64
}

// Decoding costs far more memory than the pickle's bytes: every opcode
// becomes Go values (interfaces, slices, memo and converter map entries),
// about 3 KiB for the 30 opcodes (82 bytes) of one pickled tensor view.
// Scan estimates the cost from the opcodes before anything is built, so
// that a small file cannot make the decoder allocate gigabytes.
const (
	// opCost is the estimated memory per opcode, measured at ~110 bytes on
	// dense torch pickles (a million tensor views) and rounded up.
	opCost = 128
	// payloadCost is the estimated memory per byte of string, bytes and
	// long payload (the VM's copy and the decoded value).
	payloadCost = 2
)

// Budget parameters: a file may use BudgetPerByte times its size to
// decode, and never less than MinBudget, so that real checkpoints (whose
// pickles are a small part of the file) and small files always fit while
// a file that is nearly all dense pickle cannot amplify without bound.
const (
	MinBudget     = 256 << 20
	BudgetPerByte = 16
)

// SizeBudget is the decoding budget of a file of size bytes:
// max(MinBudget, BudgetPerByte*size).
func SizeBudget(size int64) int64 {
	if size > math.MaxInt64/BudgetPerByte {
		return math.MaxInt64
	}
	return max(MinBudget, BudgetPerByte*size)
}

// BudgetError reports a pickle whose decoding would exceed its budget:
// its first Ops opcodes at byte At already need more than Budget.
type BudgetError struct {
	Budget  int64
	Ops, At int
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("pickle: decoding would need more than its memory budget of %s (%d opcodes by byte %d)",
		mib(e.Budget), e.Ops, e.At)
}

// mib formats a byte count for messages.
func mib(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%d bytes", n)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}

// DefaultLimits are generous for real checkpoints (a 100k-tensor optimizer
// pickle has a few million opcodes) and small enough to stop abuse. A
// function, not a variable: no caller can change them for everyone.
func DefaultLimits() Limits {
	return Limits{MaxOps: 100_000_000, MaxDepth: 256, MaxLine: 1 << 16}
}

// Scan walks the opcodes of the pickle at the start of data without
// building anything, and returns the length of the pickle (up to and
// including STOP). It rejects unknown opcodes and every length argument that
// claims more bytes than are left, so the VM never allocates what a corrupt
// length asks for, and a pickle whose estimated decoding cost (input,
// opCost per opcode, payloadCost per payload byte) exceeds lim.MaxBytes
// (a *BudgetError).
func Scan(data []byte, lim Limits) (int, error) {
	pos := 0
	budget := lim.MaxBytes
	// est counts the input too: it stays in memory while the VM runs.
	est := int64(len(data))
	for ops := 0; ; ops++ {
		if ops >= lim.MaxOps {
			return 0, fmt.Errorf("pickle: more than %d opcodes", lim.MaxOps)
		}
		if budget > 0 && est > budget {
			return 0, &BudgetError{Budget: budget, Ops: ops, At: pos}
		}
		est += opCost
		if pos >= len(data) {
			return 0, &TruncatedError{msg: fmt.Sprintf("%v at byte %d (no STOP opcode)", ErrTruncated, pos)}
		}
		op := data[pos]
		info := opcodes[op]
		if info.name == "" {
			return 0, fmt.Errorf("pickle: invalid opcode 0x%02x at byte %d", op, pos)
		}
		at := pos
		pos++
		rest := len(data) - pos
		need := 0
		switch info.kind {
		case argFixed:
			need = info.n
		case argLen1:
			if rest < 1 {
				return 0, truncated(info, at)
			}
			need = 1 + int(data[pos])
		case argLen4, argLenS4:
			if rest < 4 {
				return 0, truncated(info, at)
			}
			n := binary.LittleEndian.Uint32(data[pos:])
			if info.kind == argLenS4 && int32(n) < 0 {
				return 0, fmt.Errorf("pickle: %s at byte %d has negative length", info.name, at)
			}
			if uint64(n) > uint64(rest-4) {
				return 0, tooLong(info, at, pos+4, uint64(n), rest-4)
			}
			need = 4 + int(n)
		case argLen8, argFrame:
			if rest < 8 {
				return 0, truncated(info, at)
			}
			n := binary.LittleEndian.Uint64(data[pos:])
			if n > uint64(rest-8) {
				return 0, tooLong(info, at, pos+8, n, rest-8)
			}
			if info.kind == argFrame {
				need = 8 // the frame's content is ordinary opcodes that follow
			} else {
				need = 8 + int(n)
			}
		case argLine, argLine2:
			lines := 1
			if info.kind == argLine2 {
				lines = 2
			}
			p := pos
			for l := 0; l < lines; l++ {
				i := bytes.IndexByte(data[p:min(len(data), p+lim.MaxLine)], '\n')
				if i < 0 {
					return 0, fmt.Errorf("pickle: %s at byte %d: argument line missing or longer than %d bytes", info.name, at, lim.MaxLine)
				}
				p += i + 1
			}
			need = p - pos
		}
		if need > rest {
			return 0, truncated(info, at)
		}
		if info.kind != argFixed && info.kind != argFrame {
			est += payloadCost * int64(need)
		}
		pos += need
		if op == '.' {
			return pos, nil
		}
	}
}

func truncated(info opInfo, at int) error {
	return &TruncatedError{msg: fmt.Sprintf("%v: %s at byte %d", ErrTruncated, info.name, at)}
}

// tooLong reports a length argument at byte at, whose bytes would start at
// start, claiming n bytes.
func tooLong(info opInfo, at, start int, n uint64, left int) error {
	need := uint64(start) + n
	if need < n {
		need = math.MaxUint64
	}
	return &TruncatedError{Need: need,
		msg: fmt.Sprintf("%v: %s at byte %d claims %d bytes but only %d are left", ErrTruncated, info.name, at, n, left)}
}
