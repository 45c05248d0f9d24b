// Package deliveries is the one rule that works out where each delivery of a namespace stands
// from the streams that hold it, and reads pages of deliveries with it, newest first:
//
//   - finished deliveries (succeeded, dead-lettered) from the delivery log
//     (WEBHOOKS_ATTEMPTS_<ns>, 30 days), by their newest record;
//   - live ones from the deliveries stream (a copy: held, replayed, a test delivery; pending
//     until the endpoint's consumer there hands it out, then in flight, or failed and retried
//     in place once its failed attempt is logged), the retries scheduled there, and the events
//     stream (a first attempt: pending above the endpoint's consumer's acknowledgement floor,
//     in flight once handed out);
//
// each source read backwards from a cursor (internal/streamread) and merged by the time its
// messages were stored. The data API's server (internal/dataapi) is its only caller outside
// tests: every client (kubectl, the plugin, a console) reads deliveries through that API, so
// a change of where records are stored touches this package and nothing else.
//
// Every read is bounded: a page holds at most MaxLimit entries, a page reads at most
// ScanCap messages (then ends early, with a cursor), and a filter that can only be answered by
// reading record bodies (event id, event type, dead-lettered) is refused with ErrTooBroad when
// the delivery-log range it would read holds more than MaxScan messages, rather than served by
// a scan of the log.
package deliveries
