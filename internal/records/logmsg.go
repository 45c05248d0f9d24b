package records

import (
	"strconv"

	"github.com/nats-io/nats.go"
)

// MsgID is the JetStream message id of rec's delivery-log message. It names the outcome, not
// the write, so a record written again after a crash (the delivery was redelivered and came
// to the same outcome) is a duplicate the stream drops, and a fold over the log counts each
// outcome once: one success per delivery, one dead letter per delivery, one failure per
// attempt number.
func (rec *LogRecord) MsgID() string {
	switch rec.State {
	case StateSucceeded:
		return rec.DeliveryID + ":ok"
	case StateDeadLetter:
		return rec.DeliveryID + ":dl"
	}
	return rec.DeliveryID + ":" + strconv.Itoa(rec.Attempt) + ":" + rec.State
}

// Bound cuts every string a receiver or the endpoint's configuration supplied to rec (the
// response body and error, request header values) and redacts URLs in its error.
func (rec *LogRecord) Bound() {
	rec.Response = rec.Response.Bounded()
	for k, v := range rec.RequestHeaders {
		if len(v) > MaxHeaderValue {
			rec.RequestHeaders[k] = Bound(v, MaxHeaderValue)
		}
	}
}

// LogMessage is the delivery-log message of rec on subject: the record, bounded, encoded
// into buf (which it may reuse; nil is fine), with MsgID as JetStream's message id.
func LogMessage(subject string, rec *LogRecord, buf []byte) *nats.Msg {
	rec.Bound()
	return &nats.Msg{
		Subject: subject,
		Header:  nats.Header{HeaderMsgID: []string{rec.MsgID()}},
		Data:    rec.AppendJSON(buf[:0]),
	}
}
