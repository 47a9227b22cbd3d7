package testutil

import "github.com/lsync/lsync/messages"

// EmptyAnswer answers a request as a peer that holds nothing: empty pages
// (so a catch-up of it ends at once), a pong to a ping, and an error to
// anything else. Hostile peers built from the net package (the bench's
// flooder, the end-to-end tests' attacker) answer what they do not forge
// with it.
func EmptyAnswer(m messages.Message) messages.Message {
	switch r := m.(type) {
	case *messages.Ping:
		return &messages.Pong{Nonce: r.Nonce, SentAt: r.SentAt}
	case *messages.StateOwnersRequest:
		return &messages.StateOwnersResponse{}
	case *messages.StateRequest:
		return &messages.StateResponse{Owner: r.Owner}
	case *messages.SharedChangeRequest:
		return &messages.SharedChangeResponse{Origin: r.Origin}
	case *messages.SharedStateRequest:
		return &messages.SharedStateResponse{}
	}
	return &messages.Error{Code: messages.CodeUnavailable, Message: "this peer serves nothing"}
}
