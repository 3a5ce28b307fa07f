//! Web PubSub client input: the JSON and protobuf subprotocols' frames, the REST API's
//! OData filters, and access tokens (through `statehub_webpubsub::fuzzing`, which
//! reaches the crate's private decoders).

use statehub_webpubsub::fuzzing;

use crate::input::Input;

/// A JSON subprotocol text frame (the input as UTF-8, lossily, as a WebSocket text
/// frame is always valid UTF-8); its data is delivered to every subprotocol and what a
/// JSON subscriber gets decodes back to the same data.
pub fn webpubsub_json(data: &[u8]) {
    fuzzing::json_frame(&String::from_utf8_lossy(data));
}

/// A protobuf subprotocol binary frame; its data is delivered to every subprotocol.
pub fn webpubsub_protobuf(data: &[u8]) {
    fuzzing::protobuf_frame(data);
}

/// An OData filter (UTF-8, lossily, as a query string is decoded): parsed, its error
/// rendered, evaluated against a few connections.
pub fn odata_filter(data: &[u8]) {
    fuzzing::odata_filter(&String::from_utf8_lossy(data));
}

/// Access tokens. First byte even: the rest is a token string as a client or REST
/// caller sends it. Odd: the rest is a JWT header and claims (length-prefixed, then
/// the rest), signed with the configured key so that the claims get past the signature
/// to `exp`/`nbf`/`iat`, the audience and the claim shapes.
pub fn jwt(data: &[u8]) {
    let mut input = Input::new(data);
    if input.byte() & 1 == 0 {
        fuzzing::token(&String::from_utf8_lossy(input.rest()));
    } else {
        let header = input.chunk();
        let claims = input.rest();
        fuzzing::token(&fuzzing::signed_token(header, claims));
    }
}
