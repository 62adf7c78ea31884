package main

import (
	"encoding/json"
	"path/filepath"
	"strings"

	"github.com/ucp-project/ucp/internal/safetensors"
)

func isSafetensors(path string) bool {
	return strings.EqualFold(filepath.Ext(path), ".safetensors")
}

func safetensorsReport(path string) (*fileReport, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rep := &fileReport{File: path, Format: "safetensors", Tensors: []tensorReport{}}
	for _, t := range f.Tensors {
		rep.Tensors = append(rep.Tensors, tensorReport{Key: []any{t.Name}, DType: t.DType.String(), Shape: nonNil(t.Shape),
			NBytes: t.NBytes, DataOffset: t.Offset})
	}
	if f.Metadata != nil {
		rep.Meta, _ = json.Marshal(f.Metadata)
	}
	return rep, nil
}
