package megatron

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ucp-project/ucp/formats/dcp"
	"github.com/ucp-project/ucp/fragment"
)

// DistFormat is the name of Megatron's dist_checkpointing format on top of
// PyTorch DCP (--ckpt-format torch_dist), the default since core 0.9.
const DistFormat = "torch_dist"

func hasDistMetadata(dir string) bool {
	st, err := os.Stat(filepath.Join(dir, dcp.MegatronMetadataFile))
	return err == nil && st.Mode().IsRegular()
}

// DetectDist reports whether path is a Megatron dist_checkpointing
// checkpoint: an iteration folder holding metadata.json (Megatron's own
// rule), or a save folder whose latest_checkpointed_iteration.txt names one.
func DetectDist(path string) bool {
	dir, _, err := resolveIter(path, "")
	return err == nil && hasDistMetadata(dir)
}

// IndexDist builds the fragment table of the torch_dist checkpoint at path
// (a save folder or an iteration folder).
func IndexDist(ctx context.Context, path string, opt Options) (*fragment.Table, error) {
	dir, _, err := resolveIter(path, opt.Tag)
	if err != nil {
		return nil, err
	}
	be, err := dcp.MegatronBackend(dir)
	if err != nil {
		return nil, err
	}
	if be == "" {
		return nil, fmt.Errorf("%s: no %s: not a Megatron dist_checkpointing folder", dir, dcp.MegatronMetadataFile)
	}
	if be != DistFormat {
		return nil, fmt.Errorf("%s: sharded_backend %q, which ucp does not read (only %q)", filepath.Join(dir, dcp.MegatronMetadataFile), be, DistFormat)
	}
	return nil, fmt.Errorf("%s: a Megatron-LM torch_dist checkpoint, which ucp does not read yet", dir)
}
