package natsauth

import (
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// BusOf names what a namespace owns on the bus in the JetStream layout of cfg: its set of
// streams and its bucket.
func BusOf(cfg streams.Config) func(namespace string) Bus {
	return func(ns string) Bus {
		n := cfg.Names.For(ns)
		return Bus{
			Namespace:   ns,
			Events:      Stream{Name: n.EventsStream(), Subjects: []string{n.EventsFilter()}},
			Deliveries:  Stream{Name: n.DeliveriesStream(), Subjects: n.DeliveriesSubjects()},
			Attempts:    Stream{Name: n.AttemptsStream(), Subjects: n.AttemptsSubjects()},
			DeadLetters: Stream{Name: n.DeadLetterStream(), Subjects: n.DeadLetterSubjects()},
			Bucket:      n.Bucket(),
			// A replay (or a test delivery) writes one endpoint's delivery subject of its own
			// lane or its queue subject of the shared lane (one token per endpoint).
			ReplaySubjects:  n.DeliveryTargets(),
			ReplayKeyPrefix: streams.ReplayKeyPrefix,
			// The operational events (webhook_operator.*): the dispatcher publishes them,
			// producers may not forge them.
			OpsEvents:   n.EventSubject(records.OpsTypePrefix + ".>"),
			PurgeEvents: n.EventSubject(records.OpsDeadLettersPurged),
			// The ingress publishes every namespace's events but none of their operational ones.
			AllEvents:    cfg.Names.EventsSubjectPrefix + ".*.>",
			AllOpsEvents: cfg.Names.EventsSubjectPrefix + ".*." + records.OpsTypePrefix + ".>",
		}
	}
}
