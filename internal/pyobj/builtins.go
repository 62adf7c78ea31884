package pyobj

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// builtinCall gives the few builtins found in checkpoints their meaning;
// every other call becomes an inert *Object. One case per builtin, kept
// whole (over 100 lines) so the table of meanings reads in one place.
func builtinCall(g *Global, args []Value) (Value, error) {
	mod := g.Module
	switch mod {
	case "builtins":
		mod = "__builtin__"
	case "copyreg":
		mod = "copy_reg"
	}
	switch mod + "." + g.Name {
	case "__builtin__.getattr":
		// Enum members pickled by name: getattr(EnumClass, 'MEMBER').
		if len(args) == 2 {
			cls, ok1 := args[0].(*Global)
			member, ok2 := args[1].(string)
			if ok1 && ok2 {
				return Enum{Class: cls, Name: member, ByName: true}, nil
			}
		}
		return nil, fmt.Errorf("only getattr(class, 'name') is supported")
	case "__builtin__.set", "__builtin__.frozenset":
		s := &Set{Frozen: g.Name == "frozenset"}
		switch len(args) {
		case 0:
		case 1:
			items, ok := Seq(args[0])
			if !ok {
				return nil, fmt.Errorf("argument is %s, not a list", TypeName(args[0]))
			}
			s.Items = append([]Value(nil), items...)
		default:
			return nil, fmt.Errorf("%d arguments", len(args))
		}
		return s, nil
	case "_codecs.encode":
		// bytes in protocol 2: _codecs.encode('latin-1 text', 'latin1').
		if len(args) != 2 {
			return nil, fmt.Errorf("want 2 arguments, got %d", len(args))
		}
		s, ok1 := args[0].(string)
		enc, ok2 := args[1].(string)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("arguments are not strings")
		}
		return encodeString(s, enc)
	case "__builtin__.bytearray", "__builtin__.bytes":
		switch len(args) {
		case 0:
			return Bytes{}, nil
		case 1:
			if b, ok := args[0].(Bytes); ok {
				return Bytes(bytes.Clone(b)), nil
			}
		case 2:
			s, ok1 := args[0].(string)
			enc, ok2 := args[1].(string)
			if ok1 && ok2 {
				return encodeString(s, enc)
			}
		}
		return nil, fmt.Errorf("unsupported arguments")
	case "torch.Size":
		if len(args) == 0 {
			return Size{}, nil
		}
		if t, ok := args[0].(Tuple); ok && len(args) == 1 {
			s := make(Size, len(t))
			for i, e := range t {
				n, ok := e.(int64)
				if !ok {
					return nil, fmt.Errorf("element %d is %s, not an int", i, TypeName(e))
				}
				s[i] = n
			}
			return s, nil
		}
		return nil, fmt.Errorf("unsupported arguments")
	case "collections.OrderedDict", "__builtin__.dict":
		kind := OrderedDict
		if g.Name == "dict" {
			kind = PlainDict
		}
		d := NewDict(kind)
		switch len(args) {
		case 0:
		case 1:
			if src, ok := args[0].(*Dict); ok {
				for i := 0; i < src.Len(); i++ {
					d.Set(src.Item(i))
				}
				break
			}
			items, ok := Seq(args[0])
			if !ok {
				return nil, fmt.Errorf("argument is %s", TypeName(args[0]))
			}
			for _, it := range items {
				kv, ok := it.(Tuple)
				if !ok || len(kv) != 2 {
					return nil, fmt.Errorf("item is %s, not a pair", TypeName(it))
				}
				d.Set(kv[0], kv[1])
			}
		default:
			return nil, fmt.Errorf("%d arguments", len(args))
		}
		return d, nil
	case "__builtin__.list":
		switch len(args) {
		case 0:
			return &List{}, nil
		case 1:
			if items, ok := Seq(args[0]); ok {
				return &List{Items: append([]Value(nil), items...)}, nil
			}
		}
		return nil, fmt.Errorf("unsupported arguments")
	case "copy_reg._reconstructor":
		// Protocol 0/1 objects: _reconstructor(cls, object, None) is object.__new__(cls).
		if len(args) == 3 {
			cls, ok1 := args[0].(*Global)
			base, ok2 := args[1].(*Global)
			if ok1 && ok2 && (base.Module == "__builtin__" || base.Module == "builtins") && base.Name == "object" && args[2] == nil {
				return &Object{Class: cls, Via: ByNewObj}, nil
			}
		}
	}
	return &Object{Class: g, Via: ByReduce, Args: append([]Value(nil), args...)}, nil
}

func encodeString(s, enc string) (Bytes, error) {
	switch strings.ToLower(enc) {
	case "latin1", "latin-1", "iso-8859-1":
		out := make(Bytes, 0, len(s))
		for _, r := range s {
			if r > 0xff {
				return nil, fmt.Errorf("%U is not latin-1", r)
			}
			out = append(out, byte(r))
		}
		return out, nil
	case "utf-8", "utf8", "ascii":
		return Bytes(s), nil
	}
	return nil, fmt.Errorf("unsupported encoding %q", enc)
}

// escapeDecode undoes the escapes of a Python 2 str repr (STRING opcode),
// as codecs.escape_decode does.
func escapeDecode(s string) ([]byte, error) {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		if i == len(s) {
			return nil, fmt.Errorf("string ends with a backslash")
		}
		switch c = s[i]; c {
		case '\n':
			// line continuation
		case '\\', '\'', '"':
			out = append(out, c)
		case 'a':
			out = append(out, 7)
		case 'b':
			out = append(out, 8)
		case 'f':
			out = append(out, 12)
		case 'n':
			out = append(out, 10)
		case 'r':
			out = append(out, 13)
		case 't':
			out = append(out, 9)
		case 'v':
			out = append(out, 11)
		case 'x':
			if i+3 > len(s) {
				return nil, fmt.Errorf("truncated \\x escape")
			}
			v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
			if err != nil {
				return nil, fmt.Errorf("bad \\x escape %q", s[i+1:i+3])
			}
			out = append(out, byte(v))
			i += 2
		default:
			if c >= '0' && c <= '7' {
				v, n := 0, 0
				for n < 3 && i+n < len(s) && s[i+n] >= '0' && s[i+n] <= '7' {
					v = v*8 + int(s[i+n]-'0')
					n++
				}
				out = append(out, byte(v))
				i += n - 1
			} else {
				out = append(out, '\\', c) // unknown escapes stay as they are
			}
		}
	}
	return out, nil
}

// rawUnicodeDecode decodes Python's raw-unicode-escape (UNICODE opcode):
// bytes are code points 0-255 except \uXXXX and \UXXXXXXXX escapes.
func rawUnicodeDecode(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' && i+1 < len(s) && (s[i+1] == 'u' || s[i+1] == 'U') {
			n := 4
			if s[i+1] == 'U' {
				n = 8
			}
			if i+2+n > len(s) {
				return "", fmt.Errorf("truncated \\%c escape", s[i+1])
			}
			v, err := strconv.ParseUint(s[i+2:i+2+n], 16, 32)
			if err != nil || v > 0x10ffff {
				return "", fmt.Errorf("bad \\%c escape %q", s[i+1], s[i+2:i+2+n])
			}
			b.WriteRune(rune(v))
			i += 1 + n
			continue
		}
		b.WriteRune(rune(c))
	}
	return b.String(), nil
}
