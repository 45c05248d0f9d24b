package ociimage

import (
	"slices"
	"testing"
)

// TestShellWords pins the splitter the Dockerfile parse relies on.
func TestShellWords(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{`a  b`, []string{"a", "b"}},
		{`-ldflags "-s -w -X a.b=${V}" ./x`, []string{"-ldflags", "-s -w -X a.b=${V}", "./x"}},
		{`-ldflags '-s -w' x`, []string{"-ldflags", "-s -w", "x"}},
		{`A=1 B="two words" go`, []string{"A=1", "B=two words", "go"}},
		{`"a\"b" c\ d`, []string{`a"b`, "c d"}},
	} {
		got, err := ShellWords(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ShellWords(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := ShellWords(`"open`); err == nil {
		t.Error("an unterminated quote was accepted")
	}
}

func TestFinalStage(t *testing.T) {
	df := []byte(`FROM golang AS build
ARG VERSION=dev
RUN go build -o /out/x .
FROM ` + DistrolessStaticNonroot + `
ARG VERSION=dev
LABEL a="one two" \
      b=${VERSION}
COPY --from=build /out/x /x
USER 65532:65532
ENTRYPOINT ["/x"]
`)
	ins, err := ParseDockerfile(df)
	if err != nil {
		t.Fatal(err)
	}
	st, err := FinalStage(ins, map[string]string{"VERSION": "v1"})
	if err != nil {
		t.Fatal(err)
	}
	if st.From != DistrolessStaticNonroot || st.User != "65532:65532" || !slices.Equal(st.Entrypoint, []string{"/x"}) ||
		st.Labels["a"] != "one two" || st.Labels["b"] != "v1" || len(st.Copies) != 1 || st.Copies[0] != (Copy{From: "build", Src: "/out/x", Dst: "/x"}) {
		t.Errorf("stage %+v", st)
	}
	// What the packer cannot reproduce is refused, not ignored.
	for _, bad := range []string{"RUN true", "ADD a /a", "VOLUME /data", "ENTRYPOINT /x", "LABEL a=$UNDECLARED", "COPY --chown=1 a b"} {
		ins, err := ParseDockerfile([]byte("FROM scratch\n" + bad + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := FinalStage(ins, nil); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}
