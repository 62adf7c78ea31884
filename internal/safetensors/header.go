package safetensors

import (
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// The header is parsed by hand rather than with encoding/json: the format
// needs duplicate keys rejected, integers that are never floats, strings
// that cannot hold lone surrogates, and a nesting limit, all of which
// encoding/json either accepts silently or reports only after building a
// value tree.

// maxDepth is serde_json's recursion limit: 127 nested arrays/objects are
// accepted, the 128th is an error. The reference reader parses with it.
const maxDepth = 127

// rawEntry is one tensor entry of the header before validation.
type rawEntry struct {
	name       string
	dtype      refDType
	shape      []uint64
	begin, end uint64
}

// header is the parsed JSON header.
type header struct {
	metadata map[string]string // nil when absent (or null)
	entries  []rawEntry        // in JSON order
}

type parser struct {
	b     []byte
	i     int
	depth int
}

// jsonError is a syntax or schema error at a byte offset of the header.
func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("%w at header byte %d: %s", ErrJSON, p.i, fmt.Sprintf(format, args...))
}

// parseHeader parses the JSON header b (already checked to be UTF-8).
func parseHeader(b []byte) (*header, error) {
	p := &parser{b: b}
	h := &header{}
	p.ws()
	if !p.eat('{') {
		return nil, p.errorf("header must be a JSON object, found %s", p.what())
	}
	seen := map[string]bool{}
	err := p.seq('}', "header object", func() error {
		key, keyAt, err := p.key("key")
		if err != nil {
			return err
		}
		if seen[key] {
			p.i = keyAt
			return p.errorf("duplicate key %q", key)
		}
		seen[key] = true
		if key == metadataKey {
			h.metadata, err = p.metadata()
			return err
		}
		e, err := p.entry(key)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", key, err)
		}
		h.entries = append(h.entries, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	p.ws()
	if p.i != len(p.b) {
		return nil, p.errorf("trailing characters after the header object (only whitespace may follow; pad with spaces)")
	}
	return h, nil
}

// seq parses the elements of an array or object whose opener was just
// eaten: elem parses one element, commas separate them, closer ends them.
// what names the container in errors.
func (p *parser) seq(closer byte, what string, elem func() error) error {
	if err := p.enter(); err != nil {
		return err
	}
	for first := true; ; first = false {
		p.ws()
		if p.eat(closer) {
			break
		}
		if !first {
			if !p.eat(',') {
				return p.errorf("expected ',' or '%c' in %s, found %s", closer, what, p.what())
			}
			p.ws()
		}
		if err := elem(); err != nil {
			return err
		}
	}
	p.depth--
	return nil
}

// key parses an object member's `"key":` and returns the key and its
// offset (for errors about the key itself); what names keys in errors.
func (p *parser) key(what string) (string, int, error) {
	at := p.i
	k, err := p.str()
	if err != nil {
		return "", at, err
	}
	p.ws()
	if !p.eat(':') {
		return "", at, p.errorf("expected ':' after %s %q, found %s", what, k, p.what())
	}
	p.ws()
	return k, at, nil
}

// metadata parses the __metadata__ value: null, or an object of strings.
func (p *parser) metadata() (map[string]string, error) {
	if p.lit("null") {
		return nil, nil
	}
	if !p.eat('{') {
		return nil, p.errorf("__metadata__ must be an object of strings, found %s", p.what())
	}
	m := map[string]string{}
	err := p.seq('}', "__metadata__", func() error {
		k, keyAt, err := p.key("__metadata__ key")
		if err != nil {
			return err
		}
		if _, dup := m[k]; dup {
			p.i = keyAt
			return p.errorf("duplicate __metadata__ key %q", k)
		}
		if p.peek() != '"' {
			return p.errorf("__metadata__ value of %q must be a string, found %s", k, p.what())
		}
		m[k], err = p.str()
		return err
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// entry parses {"dtype": ..., "shape": [...], "data_offsets": [b, e]};
// other fields are skipped, as the reference (serde without
// deny_unknown_fields) does.
func (p *parser) entry(name string) (rawEntry, error) {
	e := rawEntry{name: name}
	if !p.eat('{') {
		return e, p.errorf("tensor entry must be a JSON object, found %s", p.what())
	}
	seen := map[string]bool{}
	err := p.seq('}', "tensor entry", func() error {
		k, keyAt, err := p.key("field")
		if err != nil {
			return err
		}
		if seen[k] {
			p.i = keyAt
			return p.errorf("duplicate field %q", k)
		}
		seen[k] = true
		switch k {
		case "dtype":
			if p.peek() != '"' {
				return p.errorf("dtype must be a string, found %s", p.what())
			}
			at := p.i
			s, err := p.str()
			if err != nil {
				return err
			}
			d, ok := refDTypeByName(s)
			if !ok {
				p.i = at
				return p.errorf("unknown dtype %q", s)
			}
			e.dtype = d
		case "shape":
			if e.shape, err = p.uints("shape", -1); err != nil {
				return err
			}
			if e.shape == nil {
				e.shape = []uint64{}
			}
		case "data_offsets":
			offs, err := p.uints("data_offsets", 2)
			if err != nil {
				return err
			}
			e.begin, e.end = offs[0], offs[1]
		default:
			return p.skip()
		}
		return nil
	})
	if err != nil {
		return e, err
	}
	for _, f := range []string{"dtype", "shape", "data_offsets"} {
		if !seen[f] {
			return e, p.errorf("missing field %q", f)
		}
	}
	return e, nil
}

// uints parses an array of non-negative integers; want >= 0 demands
// exactly that many elements.
func (p *parser) uints(field string, want int) ([]uint64, error) {
	if !p.eat('[') {
		return nil, p.errorf("%s must be an array of non-negative integers, found %s", field, p.what())
	}
	var out []uint64
	err := p.seq(']', field, func() error {
		v, err := p.uint(field)
		out = append(out, v)
		return err
	})
	if err != nil {
		return nil, err
	}
	if want >= 0 && len(out) != want {
		return nil, p.errorf("%s has %d elements, want %d", field, len(out), want)
	}
	return out, nil
}

// uint parses a non-negative integer literal that fits in uint64. JSON
// floats (2.0, 2e3, -0) are rejected, as serde does for usize fields.
func (p *parser) uint(field string) (uint64, error) {
	start := p.i
	c := p.peek()
	if c == '-' {
		return 0, p.errorf("%s has a negative number", field)
	}
	if c < '0' || c > '9' {
		return 0, p.errorf("%s must hold non-negative integers, found %s", field, p.what())
	}
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	digits := p.b[start:p.i]
	if len(digits) > 1 && digits[0] == '0' {
		p.i = start
		return 0, p.errorf("invalid number (leading zero) in %s", field)
	}
	if c := p.peek(); c == '.' || c == 'e' || c == 'E' {
		p.i = start
		return 0, p.errorf("%s must hold integers, found a floating-point number", field)
	}
	v, err := strconv.ParseUint(string(digits), 10, 64)
	if err != nil {
		p.i = start
		return 0, p.errorf("integer %s in %s does not fit in 64 bits", digits, field)
	}
	return v, nil
}

// skip checks and skips any JSON value (an ignored field).
func (p *parser) skip() error {
	switch c := p.peek(); {
	case c == '"':
		_, err := p.str()
		return err
	case c == '{':
		p.i++
		return p.seq('}', "an object", func() error {
			if _, _, err := p.key("key"); err != nil {
				return err
			}
			return p.skip()
		})
	case c == '[':
		p.i++
		return p.seq(']', "an array", p.skip)
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case p.lit("true"), p.lit("false"), p.lit("null"):
		return nil
	}
	return p.errorf("expected a JSON value, found %s", p.what())
}

// number skips a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *parser) number() error {
	p.eat('-')
	switch c := p.peek(); {
	case c == '0':
		p.i++
	case c >= '1' && c <= '9':
		p.digits()
	default:
		return p.errorf("invalid number")
	}
	if p.eat('.') {
		if p.digits() == 0 {
			return p.errorf("invalid number: no digits after '.'")
		}
	}
	if c := p.peek(); c == 'e' || c == 'E' {
		p.i++
		if c := p.peek(); c == '+' || c == '-' {
			p.i++
		}
		if p.digits() == 0 {
			return p.errorf("invalid number: no digits in exponent")
		}
	}
	return nil
}

func (p *parser) digits() int {
	n := 0
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
		n++
	}
	return n
}

// str parses a JSON string. Escapes are decoded; a lone UTF-16 surrogate
// is an error (serde_json cannot put one in a Rust String).
func (p *parser) str() (string, error) {
	if !p.eat('"') {
		return "", p.errorf("expected a string, found %s", p.what())
	}
	start := p.i
	// Fast path: no escapes.
	for p.i < len(p.b) {
		c := p.b[p.i]
		if c == '"' {
			s := string(p.b[start:p.i])
			p.i++
			return s, nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return "", p.errorf("control character 0x%02x in string (must be escaped)", c)
		}
		p.i++
	}
	buf := append([]byte(nil), p.b[start:p.i]...)
	for {
		if p.i >= len(p.b) {
			return "", p.errorf("unterminated string")
		}
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return string(buf), nil
		case c < 0x20:
			return "", p.errorf("control character 0x%02x in string (must be escaped)", c)
		case c != '\\':
			buf = append(buf, c)
			p.i++
			continue
		}
		p.i++ // backslash
		if p.i >= len(p.b) {
			return "", p.errorf("unterminated string")
		}
		esc := p.b[p.i]
		p.i++
		switch esc {
		case '"', '\\', '/':
			buf = append(buf, esc)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r, err := p.hex4()
			if err != nil {
				return "", err
			}
			switch {
			case utf16.IsSurrogate(r) && r < 0xDC00:
				if p.i+1 >= len(p.b) || p.b[p.i] != '\\' || p.b[p.i+1] != 'u' {
					return "", p.errorf("lone leading surrogate in \\u escape")
				}
				p.i += 2
				lo, err := p.hex4()
				if err != nil {
					return "", err
				}
				if lo < 0xDC00 || lo > 0xDFFF {
					return "", p.errorf("lone leading surrogate in \\u escape")
				}
				r = utf16.DecodeRune(r, lo)
			case utf16.IsSurrogate(r):
				return "", p.errorf("lone trailing surrogate in \\u escape")
			}
			buf = utf8.AppendRune(buf, r)
		default:
			p.i--
			return "", p.errorf("invalid escape %q in string", []byte{'\\', esc})
		}
	}
}

func (p *parser) hex4() (rune, error) {
	if p.i+4 > len(p.b) {
		return 0, p.errorf("truncated \\u escape")
	}
	var r rune
	for _, c := range p.b[p.i : p.i+4] {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, p.errorf("invalid hex digit in \\u escape")
		}
		r = r<<4 | rune(d)
	}
	p.i += 4
	return r, nil
}

// enter counts one more open array or object against the nesting limit.
func (p *parser) enter() error {
	p.depth++
	if p.depth > maxDepth {
		return p.errorf("nesting deeper than %d levels", maxDepth)
	}
	return nil
}

func (p *parser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) peek() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *parser) eat(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *parser) lit(s string) bool {
	if len(p.b)-p.i >= len(s) && string(p.b[p.i:p.i+len(s)]) == s {
		p.i += len(s)
		return true
	}
	return false
}

// what describes the input at the current position for error messages.
func (p *parser) what() string {
	if p.i >= len(p.b) {
		return "end of header"
	}
	switch c := p.b[p.i]; {
	case c == '"':
		return "a string"
	case c == '{':
		return "an object"
	case c == '[':
		return "an array"
	case c == '-' || (c >= '0' && c <= '9'):
		return "a number"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == 'n':
		return "null"
	case c >= 0x20 && c < 0x7f:
		return fmt.Sprintf("%q", c)
	default:
		return fmt.Sprintf("byte 0x%02x", c)
	}
}
