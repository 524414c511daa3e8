//! Bytes to messages for every generated service (build.rs, `codec_path`).

/// The codec of every generated service, freqcap's and Envoy's rate limit
/// service (build.rs, `codec_path`): prost's, except that a message that
/// does not decode (garbage, a string that is not UTF-8, a wrong wire type)
/// is the client's error, INVALID_ARGUMENT, where tonic's codec answers
/// INTERNAL, which monitoring counts as a server fault.
#[derive(Debug, Clone)]
pub struct Codec<T, U>(std::marker::PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(std::marker::PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = tonic_prost::ProstEncoder<T>;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder(std::marker::PhantomData)
    }
}

/// [`Codec`]'s decoder.
#[derive(Debug, Clone)]
pub struct Decoder<U>(std::marker::PhantomData<U>);

impl<U: prost::Message + Default + 'static> tonic::codec::Decoder for Decoder<U> {
    type Item = U;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<U>, tonic::Status> {
        // Envoy's rate limit requests: a field this server does not know
        // could change what the call means (a refund read as a debit), so
        // it is refused before decoding drops it (src/rls/wire.rs).
        if std::any::TypeId::of::<U>() == std::any::TypeId::of::<crate::rls::pb::RateLimitRequest>()
        {
            use prost::bytes::Buf;
            let bytes = buf.chunk();
            if bytes.len() == buf.remaining()
                && let Some(at) = crate::rls::wire::unknown_field(bytes)
            {
                return Err(tonic::Status::invalid_argument(format!(
                    "{at}: a field this server does not know (its Envoy rate limit proto is older \
                     than the client's); refused, so that nothing it means is debited"
                )));
            }
        }
        U::decode(buf)
            .map(Some)
            .map_err(|e| tonic::Status::invalid_argument(format!("invalid_argument: {e}")))
    }
}
