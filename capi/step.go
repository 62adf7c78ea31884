//go:build cgo

package main

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/dtype"
	"github.com/ucp-project/ucp/internal/pyobj"
	"github.com/ucp-project/ucp/internal/torchfile"
)

// step decodes a parameter's step.pt: a Python int, a float, or a 0-dim
// tensor (torch.optim.Adam/AdamW), as its kind and value.
func step(r *atomic.Reader, param string) (int, float64, error) {
	v, ok, err := r.Step(param)
	if err != nil || !ok {
		return stepNone, 0, err
	}
	if n, ok := pyobj.Int(v); ok {
		return stepInt, float64(n), nil
	}
	if f, ok := pyobj.Float(v); ok {
		return stepFloat, f, nil
	}
	b, ok := v.(*torchfile.Blob)
	if !ok || torchfile.Numel(b.Shape) != 1 || int64(len(b.Data)) != b.NBytes() {
		return stepNone, 0, fmt.Errorf("%s: the step of %s is %s, not a number or a one-element tensor", r.Dir, param, pyobj.TypeName(v))
	}
	f := make([]byte, 4)
	if err := dtype.ToFloat32(f, b.Data, b.DType); err != nil {
		return stepNone, 0, fmt.Errorf("%s: the step of %s: %w", r.Dir, param, err)
	}
	return stepTensor, float64(dtype.Float32s(f)[0]), nil
}
