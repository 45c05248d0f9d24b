package main

import "flag"

// goFlagSet lazily holds a standard-library flag set, for libraries (zap) that bind to one.
type goFlagSet struct{ set *flag.FlagSet }

func (g *goFlagSet) fs() *flag.FlagSet {
	if g.set == nil {
		g.set = flag.NewFlagSet("", flag.ContinueOnError)
	}
	return g.set
}
