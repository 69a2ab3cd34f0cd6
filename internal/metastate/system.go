package metastate

import "strings"

// System topics: a consumer group's retry and dead-letter topics are named
// by these prefixes followed by the group (internal/topicdb keeps them on
// disk). The consumers of a retry topic that a Concurrent consumer of
// topic t in group g starts store their offsets as "g%t" ("g@i%t" for a
// broadcasting instance i): group and topic names never hold a '%', and
// t, which may itself be a system topic, follows the first one.
const (
	RetryPrefix      = "%RETRY%"
	DeadLetterPrefix = "%DLQ%"
)

// SystemGroup returns the consumer group whose retry or dead-letter topic
// is topic, and false for any other topic.
func SystemGroup(topic string) (group string, ok bool) {
	for _, p := range []string{RetryPrefix, DeadLetterPrefix} {
		if g, ok := strings.CutPrefix(topic, p); ok && g != "" && !strings.Contains(g, "%") {
			return g, true
		}
	}
	return "", false
}

// RetryOrigin splits the offsets name of a retry topic's consumer,
// "<group>%<origin topic>", into its group's offsets name (a broadcasting
// consumer's group@instance) and the topic whose failures it retries.
func RetryOrigin(offsets string) (group, origin string, ok bool) {
	group, origin, ok = strings.Cut(offsets, "%")
	return group, origin, ok && group != "" && origin != ""
}

// baseGroup is the consumer group of an offsets name: a broadcasting
// consumer's group@instance is its group's, a retry consumer's
// "<group>%<topic>" its group's too.
func baseGroup(offsets string) string {
	if g, _, ok := RetryOrigin(offsets); ok {
		offsets = g
	}
	g, _, _ := strings.Cut(offsets, "@")
	return g
}

// AllowedSystem reports whether identity may do right on the system topic
// topic for offsets (the offsets a call names, "" for none). A system
// topic's calls are its group's: the retry consumer's offsets of group g
// and origin topic t need right on t in g (AllowedGroup, or AllowedSystem
// again when t is a system topic itself); any other call needs right in
// g on some topic (AllowedInGroup), and, when it names the offsets of
// another group (a group consuming g's dead letters), right in that group
// too: a right in g moves none of another group's offsets. It is false for
// a topic that is not a system topic.
func (s *State) AllowedSystem(identity, topic, offsets string, right Rights) bool {
	g, ok := SystemGroup(topic)
	if !ok {
		return false
	}
	if og, origin, ok := RetryOrigin(offsets); ok && strings.HasPrefix(topic, RetryPrefix) && baseGroup(og) == g {
		if _, sys := SystemGroup(origin); sys {
			return s.AllowedSystem(identity, origin, og, right)
		}
		return s.AllowedGroup(identity, origin, og, right)
	}
	if !s.AllowedInGroup(identity, g, right) {
		return false
	}
	if offsets != "" && !strings.HasPrefix(offsets, "%") && baseGroup(offsets) != g {
		return s.AllowedInGroup(identity, offsets, right)
	}
	return true
}

// AllowedInGroup reports whether identity may do right on some topic for
// consumer group group: always when there are no rules, else when some
// rule matching identity and group grants it on topics that are not
// system topics (a topic pattern starting with '%' names only those).
func (s *State) AllowedInGroup(identity, group string, right Rights) bool {
	if len(s.acl) == 0 {
		return true
	}
	group = baseGroup(group)
	for _, r := range s.acl {
		if r.Rights&right == right && matchPattern(r.Identity, identity) && !strings.HasPrefix(r.Topic, "%") &&
			(r.Group == "" || matchPattern(r.Group, group)) {
			return true
		}
	}
	return false
}

// OwnsInGroup reports whether a member on node owns (or is having revoked)
// a partition of some topic in consumer group group, its broadcasting
// instances' and its retry consumers' offsets included: the node whose
// consumer failed a message of the group, which parks or dead-letters it.
func (s *State) OwnsInGroup(node, group string) bool {
	for k, g := range s.groups {
		if baseGroup(k.Group) != group {
			continue
		}
		for _, o := range g.Owners {
			if m, ok := g.Members[o]; ok && o != "" && m.Node == node {
				return true
			}
		}
	}
	return false
}
