//! rmqtt-codec `v5` acknowledgements, subscriptions, DISCONNECT and AUTH ↔ ours
//! (split from `v5` to keep files short).

use std::num::NonZeroU32;

use rmqtt_codec::v5 as r;

use super::packet_id;
use super::v5::{code, nonzero_u32};
use crate::packet::*;
use crate::EncodeError;

macro_rules! ack_conversions {
    ($their:ty) => {
        impl From<$their> for PubResponse {
            fn from(a: $their) -> Self {
                PubResponse {
                    packet_id: a.packet_id.get(),
                    reason_code: ReasonCode(a.reason_code.into()),
                    reason_string: a.reason_string,
                    user_properties: a.properties,
                }
            }
        }

        impl TryFrom<&PubResponse> for $their {
            type Error = EncodeError;
            fn try_from(a: &PubResponse) -> Result<Self, EncodeError> {
                Ok(Self {
                    packet_id: packet_id(a.packet_id)?,
                    reason_code: code(a.reason_code)?,
                    properties: a.user_properties.clone(),
                    reason_string: a.reason_string.clone(),
                })
            }
        }
    };
}

ack_conversions!(r::PublishAck);
ack_conversions!(r::PublishAck2);

impl From<r::Subscribe> for Subscribe {
    fn from(s: r::Subscribe) -> Self {
        let filters = s
            .topic_filters
            .into_iter()
            .map(|(f, o)| {
                let opts = SubscriptionOptions {
                    qos: o.qos.into(),
                    no_local: o.no_local,
                    retain_as_published: o.retain_as_published,
                    retain_handling: o.retain_handling.into(),
                };
                (f, opts)
            })
            .collect();
        Subscribe {
            packet_id: s.packet_id.get(),
            subscription_identifier: s.id.map(NonZeroU32::get),
            user_properties: s.user_properties,
            filters,
        }
    }
}

impl TryFrom<&Subscribe> for r::Subscribe {
    type Error = EncodeError;
    fn try_from(s: &Subscribe) -> Result<Self, EncodeError> {
        let mut topic_filters = Vec::with_capacity(s.filters.len());
        for (f, o) in &s.filters {
            let retain_handling = r::RetainHandling::try_from(o.retain_handling)
                .map_err(|_| EncodeError::Invalid("Retain Handling above 2"))?;
            let opts = r::SubscriptionOptions {
                qos: o.qos.into(),
                no_local: o.no_local,
                retain_as_published: o.retain_as_published,
                retain_handling,
            };
            topic_filters.push((f.clone(), opts));
        }
        if s.subscription_identifier
            .is_some_and(|id| id > crate::wire::MAX_VARINT)
        {
            return Err(EncodeError::Invalid(
                "Subscription Identifier above 268435455",
            ));
        }
        Ok(r::Subscribe {
            packet_id: packet_id(s.packet_id)?,
            id: nonzero_u32(s.subscription_identifier, "Subscription Identifier 0")?,
            user_properties: s.user_properties.clone(),
            topic_filters,
        })
    }
}

impl From<r::SubscribeAck> for SubAck {
    fn from(a: r::SubscribeAck) -> Self {
        SubAck {
            packet_id: a.packet_id.get(),
            reason_codes: a.status.into_iter().map(|c| ReasonCode(c.into())).collect(),
            reason_string: a.reason_string,
            user_properties: a.properties,
        }
    }
}

impl TryFrom<&SubAck> for r::SubscribeAck {
    type Error = EncodeError;
    fn try_from(a: &SubAck) -> Result<Self, EncodeError> {
        Ok(r::SubscribeAck {
            packet_id: packet_id(a.packet_id)?,
            properties: a.user_properties.clone(),
            reason_string: a.reason_string.clone(),
            status: a
                .reason_codes
                .iter()
                .map(|&c| code(c))
                .collect::<Result<_, _>>()?,
        })
    }
}

impl From<r::Unsubscribe> for Unsubscribe {
    fn from(u: r::Unsubscribe) -> Self {
        Unsubscribe {
            packet_id: u.packet_id.get(),
            user_properties: u.user_properties,
            filters: u.topic_filters,
        }
    }
}

impl TryFrom<&Unsubscribe> for r::Unsubscribe {
    type Error = EncodeError;
    fn try_from(u: &Unsubscribe) -> Result<Self, EncodeError> {
        Ok(r::Unsubscribe {
            packet_id: packet_id(u.packet_id)?,
            user_properties: u.user_properties.clone(),
            topic_filters: u.filters.clone(),
        })
    }
}

impl From<r::UnsubscribeAck> for UnsubAck {
    fn from(a: r::UnsubscribeAck) -> Self {
        UnsubAck {
            packet_id: a.packet_id.get(),
            reason_codes: a.status.into_iter().map(|c| ReasonCode(c.into())).collect(),
            reason_string: a.reason_string,
            user_properties: a.properties,
        }
    }
}

impl TryFrom<&UnsubAck> for r::UnsubscribeAck {
    type Error = EncodeError;
    fn try_from(a: &UnsubAck) -> Result<Self, EncodeError> {
        Ok(r::UnsubscribeAck {
            packet_id: packet_id(a.packet_id)?,
            properties: a.user_properties.clone(),
            reason_string: a.reason_string.clone(),
            status: a
                .reason_codes
                .iter()
                .map(|&c| code(c))
                .collect::<Result<_, _>>()?,
        })
    }
}

impl From<r::Disconnect> for Disconnect {
    fn from(d: r::Disconnect) -> Self {
        Disconnect {
            reason_code: ReasonCode(d.reason_code.into()),
            session_expiry_interval: d.session_expiry_interval_secs,
            reason_string: d.reason_string,
            user_properties: d.user_properties,
            server_reference: d.server_reference,
        }
    }
}

impl TryFrom<&Disconnect> for r::Disconnect {
    type Error = EncodeError;
    fn try_from(d: &Disconnect) -> Result<Self, EncodeError> {
        Ok(r::Disconnect {
            reason_code: code(d.reason_code)?,
            session_expiry_interval_secs: d.session_expiry_interval,
            server_reference: d.server_reference.clone(),
            reason_string: d.reason_string.clone(),
            user_properties: d.user_properties.clone(),
        })
    }
}

impl From<r::Auth> for Auth {
    fn from(a: r::Auth) -> Self {
        Auth {
            reason_code: ReasonCode(a.reason_code.into()),
            authentication_method: a.auth_method,
            authentication_data: a.auth_data,
            reason_string: a.reason_string,
            user_properties: a.user_properties,
        }
    }
}

impl TryFrom<&Auth> for r::Auth {
    type Error = EncodeError;
    fn try_from(a: &Auth) -> Result<Self, EncodeError> {
        Ok(r::Auth {
            reason_code: code(a.reason_code)?,
            auth_method: a.authentication_method.clone(),
            auth_data: a.authentication_data.clone(),
            reason_string: a.reason_string.clone(),
            user_properties: a.user_properties.clone(),
        })
    }
}
