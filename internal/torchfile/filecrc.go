package torchfile

// CRC32 returns the CRC-32 (IEEE) of the whole committed file, combined
// from its parts without reading it back: the head segments, the tensor
// payloads (whose CRCs are known from their pieces) and the tail tile the
// file exactly.
func (w *Writer) CRC32() uint32 {
	var pieces []Piece
	for _, s := range w.Layout.Head() {
		pieces = append(pieces, NewPiece(s.Off, s.Data))
	}
	for i, b := range w.Layout.Blobs {
		pieces = append(pieces, Piece{Off: w.Layout.BlobOffset(i), Len: b.NBytes(), CRC: w.crcs[i]})
	}
	tail, _ := w.Layout.Tail(w.crcs)
	for _, s := range tail {
		pieces = append(pieces, NewPiece(s.Off, s.Data))
	}
	crc, err := CombinePieces(pieces, w.Layout.Size())
	if err != nil {
		panic("torchfile: layout does not tile the file: " + err.Error()) // a bug in Layout, not bad input
	}
	return crc
}
