package ociimage

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// Instruction is one Dockerfile instruction, continuation lines joined, comments removed.
type Instruction struct {
	Cmd  string // upper case: FROM, RUN, ...
	Args string
}

// ParseDockerfile reads a Dockerfile's instructions.
func ParseDockerfile(b []byte) ([]Instruction, error) {
	var out []Instruction
	var cur strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		trimmed := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue // comments (also inside continuations) and blank lines
		}
		if strings.HasSuffix(trimmed, `\`) {
			cur.WriteString(strings.TrimSuffix(trimmed, `\`) + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		out = append(out, Instruction{Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(args)})
		cur.Reset()
	}
	if cur.Len() > 0 {
		return nil, fmt.Errorf("the Dockerfile ends inside a continuation line: %q", cur.String())
	}
	return out, sc.Err()
}

// ShellWords splits a shell command line into words, honouring single and double quotes and
// backslash escapes (enough for a RUN or LABEL line; no globbing or substitution).
func ShellWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated ' in %q", s)
			}
			w.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte(`"\$`, s[i+1]) >= 0 {
					i++
				}
				w.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, fmt.Errorf("unterminated \" in %q", s)
			}
			inWord = true
		case c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			inWord = true
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// Stage is the final stage of a Dockerfile: what the image it builds holds and says.
type Stage struct {
	// From is the base image (FROM's argument).
	From       string
	Labels     map[string]string
	User       string
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	// Copies are the stage's COPY instructions, in order.
	Copies []Copy
}

// Copy is one `COPY [--from=<stage>] <src> <dst>`.
type Copy struct {
	From string // the stage or image copied from; empty: the build context
	Src  string
	Dst  string
}

// FinalStage interprets the last stage of a Dockerfile with the given build arguments (which
// override the ARG defaults). An instruction it cannot reproduce without a builder (RUN, ADD,
// VOLUME, ...) is an error, so an image packed from the stage never silently differs from
// what `docker build` makes.
func FinalStage(ins []Instruction, buildArgs map[string]string) (*Stage, error) {
	last := -1
	for i, in := range ins {
		if in.Cmd == "FROM" {
			last = i
		}
	}
	if last < 0 {
		return nil, fmt.Errorf("the Dockerfile has no FROM")
	}
	args := map[string]string{}
	st := &Stage{Labels: map[string]string{}}
	var err error
	expand := func(s string) string {
		return os.Expand(s, func(name string) string {
			name, def, hasDef := strings.Cut(name, ":-")
			v, ok := args[name]
			if !ok && err == nil {
				err = fmt.Errorf("the final stage uses $%s, which no ARG declares", name)
			}
			if v == "" && hasDef {
				return def
			}
			return v
		})
	}
	words := func(s string) []string {
		w, e := ShellWords(s)
		if e != nil && err == nil {
			err = e
		}
		return w
	}
	for _, in := range ins[last:] {
		switch in.Cmd {
		case "FROM":
			w := words(in.Args)
			if len(w) == 0 || strings.HasPrefix(w[0], "--") {
				return nil, fmt.Errorf("FROM %s: want the base image first", in.Args)
			}
			st.From = w[0]
		case "ARG":
			for _, a := range words(in.Args) {
				name, def, _ := strings.Cut(a, "=")
				if v, ok := buildArgs[name]; ok {
					args[name] = v
				} else {
					args[name] = def
				}
			}
		case "LABEL":
			for _, kv := range words(in.Args) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return nil, fmt.Errorf("LABEL %q: want key=value", kv)
				}
				st.Labels[k] = expand(v)
			}
		case "ENV":
			for _, kv := range words(in.Args) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return nil, fmt.Errorf("ENV %q: want key=value", kv)
				}
				st.Env = append(st.Env, k+"="+expand(v))
			}
		case "USER":
			st.User = expand(in.Args)
		case "WORKDIR":
			st.WorkingDir = expand(in.Args)
		case "ENTRYPOINT", "CMD":
			var exec []string
			if e := json.Unmarshal([]byte(in.Args), &exec); e != nil {
				return nil, fmt.Errorf("%s %s: want the exec (JSON) form: %v", in.Cmd, in.Args, e)
			}
			if in.Cmd == "ENTRYPOINT" {
				st.Entrypoint = exec
			} else {
				st.Cmd = exec
			}
		case "COPY":
			w := words(in.Args)
			var c Copy
			for len(w) > 0 && strings.HasPrefix(w[0], "--") {
				if v, ok := strings.CutPrefix(w[0], "--from="); ok {
					c.From = v
				} else {
					return nil, fmt.Errorf("COPY %s: the option %s is not supported", in.Args, w[0])
				}
				w = w[1:]
			}
			if len(w) != 2 {
				return nil, fmt.Errorf("COPY %s: want one source and one destination", in.Args)
			}
			c.Src, c.Dst = expand(w[0]), expand(w[1])
			st.Copies = append(st.Copies, c)
		default:
			return nil, fmt.Errorf("the final stage's %s instruction cannot be packed without a builder", in.Cmd)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", in.Cmd, in.Args, err)
		}
	}
	return st, nil
}
