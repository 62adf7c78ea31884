package dcp

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/ucp-project/ucp/internal/fsutil"
)

// MegatronMetadataFile is the metadata.json Megatron-LM's dist_checkpointing
// writes last into a checkpoint folder. A DCP folder holding it is a
// Megatron torch_dist checkpoint: its keys follow Megatron's rules (stacked
// layers, fused tensors, bucketed optimizer state), which the generic reader
// would get wrong, so Detect and Index refuse it.
const MegatronMetadataFile = "metadata.json"

// MegatronBackend returns the sharded_backend the metadata.json of dir names
// ("torch_dist", "zarr"), "" when dir has no metadata.json, and an error when
// the file does not parse or names no backend.
func MegatronBackend(dir string) (string, error) {
	path := filepath.Join(dir, MegatronMetadataFile)
	b, err := fsutil.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var md struct {
		Backend *string `json:"sharded_backend"`
	}
	if err := json.Unmarshal(b, &md); err != nil {
		return "", fmt.Errorf("%s: not Megatron's dist_checkpointing metadata: %w", path, err)
	}
	if md.Backend == nil || *md.Backend == "" {
		return "", fmt.Errorf("%s: no sharded_backend (not Megatron's dist_checkpointing metadata)", path)
	}
	return *md.Backend, nil
}

// isMegatron reports whether dir holds a metadata.json (valid or not).
func isMegatron(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, MegatronMetadataFile))
	return err == nil
}

// refuseMegatron is the error for a Megatron folder given to the generic reader.
func refuseMegatron(dir string) error {
	be, err := MegatronBackend(dir)
	if err != nil {
		return err
	}
	return fmt.Errorf("%s: a Megatron-LM dist_checkpointing folder (%s says sharded_backend %q), not a plain DCP checkpoint; read it with --from torch_dist",
		dir, MegatronMetadataFile, be)
}
