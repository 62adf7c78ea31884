package deepspeed

// Detect reports whether path looks like a DeepSpeed ZeRO-0/1/2 checkpoint
// (a save folder with 'latest' or a tag folder with mp_rank model states).
func (s *Scan) Detect(path string) bool {
	f, err := s.Files(path, "")
	return err == nil && len(f.Model) > 0
}
