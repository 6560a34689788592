//! The gRPC codec of ichor's Talos client and of the twin's Talos server (`build.rs` names
//! it for every generated method): prost's encoding, with per-call buffers sized to the
//! Talos messages ichor sends and mostly gets (a few hundred bytes) instead of tonic's
//! 8 KiB. Larger messages grow the buffer as before; an 8 KiB buffer per call and per
//! direction was allocated outside the allocator's small-size caches on every call.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// The first buffer of each call, each way.
const BUFFER: usize = 512;
/// Tonic's own default: how much a streamed body encodes before yielding.
const YIELD_AFTER: usize = 32 * 1024;

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER, YIELD_AFTER)
}

/// Prost's codec with small first buffers.
#[derive(Debug, Clone)]
pub struct SmallCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SmallCodec<T, U> {
    fn default() -> Self {
        SmallCodec(PhantomData)
    }
}

impl<T, U> Codec for SmallCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> ProstEncoder<T> {
        ProstEncoder::new(settings())
    }

    fn decoder(&mut self) -> ProstDecoder<U> {
        ProstDecoder::new(settings())
    }
}
