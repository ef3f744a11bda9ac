package estimator

// EndUserFields are the fields of a request body that may name the
// caller's end user (a tenant's end-user policy says which one counts),
// each as the JSON value it held (nil: absent or null): OpenAI's `user`
// and `safety_identifier`, Anthropic's `metadata.user_id`. They are read
// from the object the parse decoded anyway, so a request pays nothing more
// for them; their form is checked by whoever uses one
// (rule.ValidateEndUserID), only when a policy names it.
type EndUserFields struct {
	User             any
	SafetyIdentifier any
	MetadataUserID   any
	// Messages says the body is Anthropic's Messages API, whose one
	// end-user field is metadata.user_id (Anthropic refuses a top-level
	// user or safety_identifier).
	Messages bool
}

// The body fields that may name an end user, by the names policies use.
const (
	FieldUser             = "user"
	FieldSafetyIdentifier = "safety_identifier"
	FieldMetadataUserID   = "metadata.user_id"
)

// Field is the body field a policy naming end users by the body field
// source reads on this request's wire, so that one policy names end users
// on every wire. On OpenAI's wire (and tokengate's own admission API) it
// is source itself: user, safety_identifier, or metadata.user_id (OpenAI's
// chat and responses bodies carry a metadata object too). On Anthropic's
// Messages wire it is metadata.user_id whatever source says: that is the
// wire's only end-user field, Anthropic's name for what OpenAI calls user
// (or safety_identifier), and a Messages body cannot carry the others.
// A source that names no body field is returned as it is.
func (f EndUserFields) Field(source string) string {
	switch source {
	case FieldUser, FieldSafetyIdentifier, FieldMetadataUserID:
		if f.Messages {
			return FieldMetadataUserID
		}
	}
	return source
}

// Value is the JSON value of the body field field (Field's names), nil
// when the body does not carry it.
func (f EndUserFields) Value(field string) any {
	switch field {
	case FieldUser:
		return f.User
	case FieldSafetyIdentifier:
		return f.SafetyIdentifier
	case FieldMetadataUserID:
		return f.MetadataUserID
	}
	return nil
}

// Named lists the end-user fields the body carries on its wire (not
// null), in the order user, safety_identifier, metadata.user_id: what a
// policy reading another field would otherwise pass over in silence.
func (f EndUserFields) Named() []string {
	var named []string
	for _, field := range []string{FieldUser, FieldSafetyIdentifier, FieldMetadataUserID} {
		if f.Messages && field != FieldMetadataUserID {
			continue // not a Messages field: Anthropic would refuse it
		}
		if f.Value(field) != nil {
			named = append(named, field)
		}
	}
	return named
}

// EndUserFields returns the request's end-user fields.
func (r *Request) EndUserFields() EndUserFields {
	if r == nil {
		return EndUserFields{}
	}
	f := r.endUser
	f.Messages = r.messagesAPI
	return f
}

// endUserFieldsOf reads the end-user fields of a decoded body.
func endUserFieldsOf(obj map[string]any) EndUserFields {
	f := EndUserFields{User: obj["user"], SafetyIdentifier: obj["safety_identifier"]}
	if m, ok := obj["metadata"].(map[string]any); ok {
		f.MetadataUserID = m["user_id"]
	}
	return f
}
