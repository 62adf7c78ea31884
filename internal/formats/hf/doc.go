// Package hf writes an atomic checkpoint as a Hugging Face model folder:
// safetensors files (model.safetensors, or shards and
// model.safetensors.index.json) or torch.save files (pytorch_model.bin, or
// shards and pytorch_model.bin.index.json), as transformers'
// save_pretrained writes them. Tensor names are the atomic parameter names,
// or, with an architecture mapping (Arch "llama"), the names of the
// transformers model class with fused tensors split and a config.json.
//
// Values are the float32 master weights cast to the output dtype with
// round-to-nearest-even (dtype.FromFloat32; 1 added in float32 first for
// the norm weights of Megatron's apply_layernorm_1p). Each file's tensors
// are written by layout.WriteFills, the resharding writers' workers:
// ranges copied in the kernel or cast through small buffers, so memory
// does not grow with the model. Everything is written in DST.partial,
// which is renamed to DST when complete. The files are described in
// FORMAT.md.
package hf
