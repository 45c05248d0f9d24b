package opconfig

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"
)

// The streams' placement is nil by default (JetStream places them in the controller's
// cluster) and set by either flag.
func TestStreamPlacementFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want *jetstream.Placement
	}{
		{nil, nil},
		{[]string{"--stream-placement-cluster=east"}, &jetstream.Placement{Cluster: "east"}},
		{[]string{"--stream-placement-tags=az:a, ssd"}, &jetstream.Placement{Tags: []string{"az:a", "ssd"}}},
		{[]string{"--stream-placement-tags=ssd", "--stream-placement-cluster=east"}, &jetstream.Placement{Cluster: "east", Tags: []string{"ssd"}}},
	} {
		cfg := Default()
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		cfg.AddFlags(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if !reflect.DeepEqual(cfg.Streams.Placement, c.want) {
			t.Errorf("%v: placement %+v, want %+v", c.args, cfg.Streams.Placement, c.want)
		}
		set := cfg.Streams.For("shop")
		for _, sc := range set.StreamConfigs() {
			if !reflect.DeepEqual(sc.Placement, c.want) {
				t.Errorf("%v: stream %s placed %+v, want %+v", c.args, sc.Name, sc.Placement, c.want)
			}
		}
		if got := set.BucketConfig().Placement; !reflect.DeepEqual(got, c.want) {
			t.Errorf("%v: bucket placed %+v, want %+v", c.args, got, c.want)
		}
	}
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	cfg := Default()
	cfg.AddFlags(fs)
	if err := fs.Parse([]string{"--stream-placement-cluster=a.b"}); err == nil {
		t.Error("a cluster name with a dot was accepted")
	}
}

// A controller allowed to send tokens in clear passes that on to its dispatchers (they send
// theirs); whether the callout accepts API-audience tokens is the controller's alone.
func TestDispatchersFollowThePlaintextTokensFlag(t *testing.T) {
	for _, allow := range []bool{false, true} {
		cfg := Default()
		cfg.NATS.AllowPlaintextTokens, cfg.NATS.AllowAPIAudienceTokens = allow, true
		got := Default()
		fs := pflag.NewFlagSet("dispatcher", pflag.ContinueOnError)
		got.AddFlags(fs)
		if err := fs.Parse(cfg.DispatcherArgs()); err != nil {
			t.Fatal(err)
		}
		if got.NATS.AllowPlaintextTokens != allow || got.NATS.AllowAPIAudienceTokens {
			t.Errorf("allow %v: the dispatcher parsed %+v from %q", allow, got.NATS, cfg.DispatcherArgs())
		}
	}
}

// The installer's outbound settings reach the dispatchers through their arguments, and the
// guard both run with (Outbound) refuses the blocked ranges whatever the allowed ones open.
func TestOutboundSettingsReachTheDispatchers(t *testing.T) {
	cfg := Default()
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	if err := fs.Parse([]string{"--allowed-cidrs=10.0.0.0/8", "--blocked-cidrs=10.244.0.0/16, 2600:1f18:abcd::/56"}); err != nil {
		t.Fatal(err)
	}
	got := Default()
	fs = pflag.NewFlagSet("dispatcher", pflag.ContinueOnError)
	got.AddFlags(fs)
	if err := fs.Parse(cfg.DispatcherArgs()); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Outbound(), cfg.Outbound()) || len(got.Outbound().Blocked) != 2 {
		t.Errorf("the dispatcher's guard %+v, the controller's %+v", got.Outbound(), cfg.Outbound())
	}
	g := got.Outbound()
	for addr, refused := range map[string]bool{"10.1.2.3": false, "10.244.1.2": true, "2600:1f18:abcd::1": true, "2600:1f18:abce::1": false} {
		if err := g.CheckAddr(netip.MustParseAddr(addr)); (err != nil) != refused {
			t.Errorf("%s: %v, want refused %v", addr, err, refused)
		}
	}
}
