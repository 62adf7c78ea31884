module github.com/ucp-project/ucp

go 1.26.8

require (
	github.com/nlpodyssey/gopickle v0.3.0
	github.com/x448/float16 v0.8.4
)

require golang.org/x/text v0.14.0 // indirect
