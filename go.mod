module github.com/ucp-project/ucp

go 1.26.8

require (
	github.com/klauspost/compress v1.20.4
	github.com/nlpodyssey/gopickle v0.3.0
	github.com/schollz/progressbar/v3 v3.19.1
	github.com/spf13/cobra v1.10.2
	github.com/spf13/pflag v1.0.9
	github.com/x448/float16 v0.8.4
	golang.org/x/sync v0.24.0
	golang.org/x/sys v0.46.0
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/mitchellh/colorstring v0.0.0-20190213212951-d06e56a500db // indirect
	github.com/rivo/uniseg v0.4.7 // indirect
	golang.org/x/term v0.44.0 // indirect
	golang.org/x/text v0.14.0 // indirect
)
