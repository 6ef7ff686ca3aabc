//! Decoding a token at a time: each sequence keeps its keys and values per block, so a new
//! position costs one row through every layer instead of the whole prefix again.

use burn::tensor::{Tensor, TensorData};

use super::attention::{attend, rotate_position};
use super::model::{Decoder, Layers};
use crate::dpsgd::ghost::Plain;
use crate::dpsgd::params::values;

/// One sequence's keys and values in every block (rotated, for rotary models).
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    /// Per block: keys and values of the positions fed so far, position-major.
    blocks: Vec<(Vec<f32>, Vec<f32>)>,
}

impl KvCache {
    /// Positions fed so far, for a decoder whose keys are `kv_width` wide.
    pub fn len(&self, kv_width: usize) -> usize {
        self.blocks.first().map_or(0, |(keys, _)| keys.len() / kv_width)
    }
}

impl Decoder {
    /// Feeds sequence s its next token `tokens[s]` (at position `caches[s]`'s length; with
    /// `lagged[k][s]`, its further inputs) and returns the logits of the token after it,
    /// sequences × vocabulary: the logits `forward` gives at that position, without
    /// recomputing the positions before it.
    pub fn step(&self, tokens: &[u32], lagged: &[&[u32]], caches: &mut [KvCache]) -> Vec<f32> {
        let heads = self.heads();
        let (q_width, kv_width) = (heads.heads * heads.dim, heads.kv_width());
        let positions: Vec<u32> = caches.iter().map(|c| c.len(kv_width) as u32).collect();
        let mut plain = Plain;
        let mut layers = Layers { hook: &mut plain, frozen: true };
        let mut x = self.embed(&mut layers, tokens, &positions, lagged);
        let device = x.device();
        let rotary = self.positions.is_none();
        for (i, block) in self.blocks.iter().enumerate() {
            let h = layers.norm(&block.attention_norm, x.clone());
            let mut qkv = values(layers.project(&block.qkv, h).into_data());
            let attended: Vec<f32> = qkv
                .chunks_mut(q_width + 2 * kv_width)
                .zip(caches.iter_mut())
                .zip(&positions)
                .flat_map(|((row, cache), &position)| {
                    let (query, rest) = row.split_at_mut(q_width);
                    if rotary {
                        rotate_position(query, position as usize, heads.dim, self.rope_base);
                        rotate_position(&mut rest[..kv_width], position as usize, heads.dim, self.rope_base);
                    }
                    if cache.blocks.len() <= i {
                        cache.blocks.push(Default::default());
                    }
                    let (keys, vals) = &mut cache.blocks[i];
                    keys.extend_from_slice(&rest[..kv_width]);
                    vals.extend_from_slice(&rest[kv_width..]);
                    attend(query, keys, vals, heads)
                })
                .collect();
            let attended = Tensor::<2>::from_data(TensorData::new(attended, [tokens.len(), q_width]), &device);
            x = x + layers.project(&block.output, attended);
            let h = layers.norm(&block.mlp_norm, x.clone());
            x = x + self.mlp(&mut layers, block, h);
        }
        values(self.logits(&mut layers, x).into_data())
    }
}
