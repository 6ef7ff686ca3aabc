//! Rows as text for the language-model generators: "income is >50K, age is 35 to 39, …",
//! the target column first and the rest in the spec's order, each value the label of its
//! public bin. Everything here comes from the declared schema and the model's tokenizer,
//! never from data.
//!
//! Each piece is tokenized on its own (a column's prefix ", age is", a value " 35 to 39"),
//! and a row's tokens are the pieces' tokens in order, so that a row has exactly one token
//! sequence, the same in training and sampling. The grammar a [`RowCursor`] walks follows
//! from it: a prefix's tokens are forced; a value's are a path in its column's trie of bin
//! labels, ended by the next prefix's first token (or the end-of-text token). Every
//! sequence the grammar accepts parses back into one bin per column.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::data::domain::{Binning, ColumnDomain, Domain, Encoding};
use crate::decoder::CheckpointError;
use crate::decoder::tokenizer::TextTokenizer;

/// A value's label: a category, an integer or an integer range, a real range; "missing"
/// and "other" for the extra bins.
pub fn value_label(column: &ColumnDomain, bin: usize) -> String {
    let value_bins = column.value_bins();
    if bin == value_bins {
        return "missing".to_string();
    }
    match &column.encoding {
        Encoding::Categorical { categories, .. } => categories.get(bin).cloned().unwrap_or_else(|| "other".to_string()),
        Encoding::Numeric { binning: Binning::Integer(ranges), .. } => match ranges[bin] {
            (lo, hi) if lo == hi => lo.to_string(),
            (lo, hi) => format!("{lo} to {hi}"),
        },
        Encoding::Numeric { binning: Binning::Real(edges), .. } => {
            format!("{} to {}", real(edges[bin]), real(edges[bin + 1]))
        }
    }
}

/// A real bin edge, short: at most 6 significant digits, no trailing zeros.
fn real(v: f64) -> String {
    let text = format!("{:.*}", (5 - v.abs().log10().floor().clamp(-6.0, 5.0) as i32).max(0) as usize, v);
    if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.').to_string() } else { text }
}

/// A column's bin labels as token paths: node 0 is the root.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Trie {
    /// Per node: its children by token.
    children: Vec<BTreeMap<u32, usize>>,
    /// Per node: the bin whose label ends there.
    ends: Vec<Option<usize>>,
}

impl Trie {
    fn insert(&mut self, tokens: &[u32], bin: usize) -> Result<(), String> {
        if self.children.is_empty() {
            self.children.push(BTreeMap::new());
            self.ends.push(None);
        }
        let mut node = 0;
        for &t in tokens {
            node = match self.children[node].get(&t) {
                Some(&next) => next,
                None => {
                    self.children.push(BTreeMap::new());
                    self.ends.push(None);
                    let next = self.children.len() - 1;
                    self.children[node].insert(t, next);
                    next
                }
            };
        }
        match self.ends[node].replace(bin) {
            Some(other) => Err(format!("bins {other} and {bin} read alike")),
            None => Ok(()),
        }
    }
}

/// How a job's rows read as text, in a tokenizer's ids.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RowText {
    /// Columns in text order (the target first).
    pub order: Vec<usize>,
    /// Per position in `order`: the tokens of its prefix ("income is", ", age is").
    prefixes: Vec<Vec<u32>>,
    /// Per position: each bin's tokens (" >50K").
    values: Vec<Vec<Vec<u32>>>,
    tries: Vec<Trie>,
    /// Ends a row.
    pub end: u32,
    /// The tokenizer's id of each token.
    vocabulary: Vec<u32>,
}

/// A row as tokens, with which of them are a value's (its label's tokens and the token
/// that ends it): what the value-token loss weight applies to. A prompted row starts with
/// `prompt` tokens of context, which carry no loss.
#[derive(Clone, Debug, PartialEq)]
pub struct RowTokens {
    pub tokens: Vec<u32>,
    pub value: Vec<bool>,
    pub prompt: usize,
}

impl RowTokens {
    /// `self` after `context` rows: what the model reads before writing this row.
    pub fn prompted<'a>(self, context: impl IntoIterator<Item = &'a RowTokens>) -> RowTokens {
        let mut out = RowTokens { tokens: Vec::new(), value: Vec::new(), prompt: 0 };
        for row in context {
            out.tokens.extend(&row.tokens);
            out.value.extend(&row.value);
        }
        out.prompt = out.tokens.len();
        out.tokens.extend(self.tokens);
        out.value.extend(self.value);
        out
    }
}

impl RowText {
    /// The text layout of `domain`'s columns for a tokenizer with an end-of-text token.
    pub fn new(domain: &Domain, target: Option<usize>, tokenizer: &TextTokenizer) -> Result<Self, CheckpointError> {
        let invalid = |m: String| CheckpointError::Format(format!("rows as text: {m}"));
        let end = tokenizer.eos.ok_or_else(|| invalid("the tokenizer names no end-of-text token".into()))?;
        let mut order: Vec<usize> = target.into_iter().collect();
        order.extend((0..domain.columns.len()).filter(|c| Some(*c) != target));
        let mut prefixes: Vec<Vec<u32>> = Vec::with_capacity(order.len());
        let mut values: Vec<Vec<Vec<u32>>> = Vec::with_capacity(order.len());
        let mut tries = Vec::with_capacity(order.len());
        for (i, &c) in order.iter().enumerate() {
            let column = &domain.columns[c];
            let prefix = if i == 0 { format!("{} is", column.name) } else { format!(", {} is", column.name) };
            prefixes.push(tokenizer.encode(&prefix)?);
            let labels: Vec<Vec<u32>> = (0..column.bins())
                .map(|b| tokenizer.encode(&format!(" {}", value_label(column, b))))
                .collect::<Result<_, _>>()?;
            let mut trie = Trie::default();
            for (bin, tokens) in labels.iter().enumerate() {
                trie.insert(tokens, bin).map_err(|e| invalid(format!("column {}: {e}", column.name)))?;
            }
            values.push(labels);
            tries.push(trie);
        }
        if prefixes.iter().any(Vec::is_empty) {
            return Err(invalid("a column's prefix has no tokens".into()));
        }
        // A value ends where the next piece starts: that token must not also continue a
        // label that has already ended.
        for i in 0..order.len() {
            let stop = prefixes.get(i + 1).map_or(end, |p| p[0]);
            let trie = &tries[i];
            if (0..trie.ends.len()).any(|n| trie.ends[n].is_some() && trie.children[n].contains_key(&stop)) {
                return Err(invalid(format!(
                    "a value of {} runs on into the next piece",
                    domain.columns[order[i]].name
                )));
            }
        }
        // Every token the grammar can produce, ascending; from here on a token is its
        // index in that list (a model restricted to it: `Decoder::restricted`).
        let mut vocabulary: Vec<u32> = prefixes.iter().chain(values.iter().flatten()).flatten().copied().collect();
        vocabulary.push(end);
        vocabulary.sort_unstable();
        vocabulary.dedup();
        let index = |t: u32| vocabulary.binary_search(&t).expect("a grammar token") as u32;
        prefixes.iter_mut().flatten().for_each(|t| *t = index(*t));
        values.iter_mut().flatten().flatten().for_each(|t| *t = index(*t));
        for trie in &mut tries {
            for children in &mut trie.children {
                *children = std::mem::take(children).into_iter().map(|(t, n)| (index(t), n)).collect();
            }
        }
        let end = index(end);
        Ok(Self { order, prefixes, values, tries, end, vocabulary })
    }

    /// The tokenizer's ids of the grammar's tokens, in ascending order: token k of a row
    /// is the tokenizer's `vocabulary()[k]`.
    pub fn vocabulary(&self) -> &[u32] {
        &self.vocabulary
    }

    /// A row's tokens as the tokenizer's ids (to read them as text).
    pub fn tokenizer_ids(&self, tokens: &[u32]) -> Vec<u32> {
        tokens.iter().map(|&t| self.vocabulary[t as usize]).collect()
    }

    /// Most tokens a row takes (the end token included).
    pub fn longest(&self) -> usize {
        let pieces: usize = self
            .prefixes
            .iter()
            .zip(&self.values)
            .map(|(prefix, labels)| prefix.len() + labels.iter().map(Vec::len).max().unwrap_or(0))
            .sum();
        pieces + 1
    }

    /// The tokens of a row of bins (indexed by column, as the domain orders them).
    pub fn encode(&self, bins: &[usize]) -> RowTokens {
        let mut out = RowTokens { tokens: Vec::new(), value: Vec::new(), prompt: 0 };
        for (i, &c) in self.order.iter().enumerate() {
            let prefix = &self.prefixes[i];
            // A prefix's first token ends the previous value.
            out.value.extend((0..prefix.len()).map(|k| k == 0 && i > 0));
            out.tokens.extend(prefix);
            let label = &self.values[i][bins[c]];
            out.tokens.extend(label);
            out.value.extend(std::iter::repeat_n(true, label.len()));
        }
        out.tokens.push(self.end);
        out.value.push(true);
        out
    }

    /// A cursor at the start of a row.
    pub fn cursor(&self) -> RowCursor<'_> {
        RowCursor { text: self, position: 0, state: State::Prefix(0), bins: vec![0; self.order.len()] }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    /// Inside the prefix of the column at `position`, this many tokens in.
    Prefix(usize),
    /// Inside its value, at a trie node.
    Value(usize),
    Done,
}

/// Where a row's decoding stands in the grammar.
#[derive(Clone, Debug)]
pub struct RowCursor<'a> {
    text: &'a RowText,
    position: usize,
    state: State,
    /// Decoded bins by position in `order`.
    bins: Vec<usize>,
}

impl RowCursor<'_> {
    /// The token that follows unless a choice is due (inside a prefix).
    pub fn forced(&self) -> Option<u32> {
        match self.state {
            State::Prefix(k) => Some(self.text.prefixes[self.position][k]),
            _ => None,
        }
    }

    /// The tokens allowed next; empty once the row is done.
    pub fn allowed(&self) -> Vec<u32> {
        match self.state {
            State::Prefix(_) => self.forced().into_iter().collect(),
            State::Value(node) => {
                let trie = &self.text.tries[self.position];
                let mut out: Vec<u32> = trie.children[node].keys().copied().collect();
                if trie.ends[node].is_some() {
                    out.push(self.stop());
                }
                out
            }
            State::Done => Vec::new(),
        }
    }

    fn stop(&self) -> u32 {
        self.text.prefixes.get(self.position + 1).map_or(self.text.end, |p| p[0])
    }

    /// Takes a token the grammar allows (anything else is refused and changes nothing).
    pub fn advance(&mut self, token: u32) -> Result<(), u32> {
        let text = self.text;
        self.state = match self.state {
            State::Prefix(k) if text.prefixes[self.position][k] == token => {
                if k + 1 < text.prefixes[self.position].len() { State::Prefix(k + 1) } else { State::Value(0) }
            }
            State::Value(node) => {
                let trie = &text.tries[self.position];
                match (trie.children[node].get(&token), trie.ends[node]) {
                    (Some(&next), _) => State::Value(next),
                    (None, Some(bin)) if token == self.stop() => {
                        self.bins[self.position] = bin;
                        self.position += 1;
                        if self.position == text.order.len() {
                            State::Done
                        } else if text.prefixes[self.position].len() > 1 {
                            State::Prefix(1)
                        } else {
                            State::Value(0)
                        }
                    }
                    _ => return Err(token),
                }
            }
            _ => return Err(token),
        };
        Ok(())
    }

    /// The row's bins by column (the domain's order), once it is done.
    pub fn row(&self) -> Option<Vec<usize>> {
        (self.state == State::Done).then(|| {
            let mut bins = vec![0; self.bins.len()];
            self.text.order.iter().zip(&self.bins).for_each(|(&c, &b)| bins[c] = b);
            bins
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use rand::rngs::ChaCha8Rng;
    use rand::{RngExt, SeedableRng};

    use super::*;
    use crate::decoder::gguf::Gguf;
    use crate::spec::{ColumnKind, JobSpec};

    fn adult() -> (Domain, Option<usize>) {
        let spec = JobSpec::parse(include_str!("../../../../examples/adult-pate.toml"), "adult").unwrap();
        let domain = Domain::from_spec(&spec);
        let target = domain.index_of("income");
        (domain, target)
    }

    fn categorical(categories: &[&str], missing: bool) -> ColumnDomain {
        let categories = categories.iter().map(|c| c.to_string()).collect();
        ColumnDomain { name: "c".into(), encoding: Encoding::Categorical { categories, other: false }, missing }
    }

    /// A byte-level tokenizer over printable ASCII, whose merges make some labels
    /// prefixes of others (" 1" of " 10": "Ġ1" and "Ġ1", "0"), as real BPE vocabularies do.
    pub(crate) fn tokenizer() -> TextTokenizer {
        let mut vocab: Vec<String> = (b'!'..=b'~').map(|b| (b as char).to_string()).collect();
        vocab.extend(["Ġ", "Ġi", "Ġis", "Ġ1", "<|end|>"].map(String::from));
        let merges = ["Ġ i", "Ġi s", "Ġ 1"];
        let eos = vocab.len() as u32 - 1;
        let vocab: serde_json::Map<String, serde_json::Value> =
            vocab.iter().enumerate().map(|(i, t)| (t.clone(), i.into())).collect();
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": merges}
        });
        TextTokenizer::from_json(json.to_string().as_bytes(), Some(eos)).unwrap()
    }

    /// Walks a row's tokens through the grammar: every token allowed, prefixes forced,
    /// and the row parses back to its bins.
    fn walk(text: &RowText, bins: &[usize]) -> RowTokens {
        let encoded = text.encode(bins);
        assert_eq!(encoded.tokens.len(), encoded.value.len());
        let mut cursor = text.cursor();
        for &t in &encoded.tokens {
            assert!(cursor.allowed().contains(&t), "{t} not allowed");
            if let Some(forced) = cursor.forced() {
                assert_eq!(forced, t);
            }
            cursor.advance(t).unwrap();
        }
        assert!(cursor.allowed().is_empty());
        assert_eq!(cursor.row().unwrap(), bins);
        encoded
    }

    /// Every bin of every column, each in at least one row.
    fn every_bin(domain: &Domain) -> Vec<Vec<usize>> {
        let most = domain.columns.iter().map(ColumnDomain::bins).max().unwrap();
        (0..most).map(|b| domain.columns.iter().map(|c| b.min(c.bins() - 1)).collect()).collect()
    }

    #[test]
    fn every_row_reads_as_text_and_parses_back() {
        let (domain, target) = adult();
        let tokenizer = tokenizer();
        let text = RowText::new(&domain, target, &tokenizer).unwrap();
        assert_eq!(text.order[0], target.unwrap());
        let mut rng = ChaCha8Rng::from_seed([2; 32]);
        for _ in 0..300 {
            let bins: Vec<usize> = domain.columns.iter().map(|c| rng.random_range(0..c.bins())).collect();
            walk(&text, &bins);
        }
        every_bin(&domain).iter().for_each(|bins| {
            walk(&text, bins);
        });
        let first: Vec<usize> = domain.columns.iter().map(|_| 0).collect();
        let encoded = text.encode(&first);
        let decoded = tokenizer.decode(&text.tokenizer_ids(&encoded.tokens[..encoded.tokens.len() - 1])).unwrap();
        assert!(decoded.starts_with("income is <=50K, age is 17 to 18, workclass is Private"), "{decoded}");
        // Value tokens: the labels and the token that ends each (a comma, then the end).
        let values = encoded.tokens.iter().zip(&encoded.value).filter(|(_, v)| **v).count();
        let labels: usize = text.order.iter().enumerate().map(|(i, &c)| text.values[i][first[c]].len()).sum();
        assert_eq!(values, labels + text.order.len());
        // Tokens are indices into the grammar's vocabulary, the end token among them.
        assert!(encoded.tokens.iter().all(|&t| (t as usize) < text.vocabulary().len()));
        assert_eq!(text.tokenizer_ids(&[text.end]), [tokenizer.eos.unwrap()]);
    }

    /// A label that is a prefix of another (" 1" of " 10"): the choice is the next token,
    /// the separator or the continuation, and both parse.
    #[test]
    fn a_label_inside_another_is_ended_by_the_next_piece() {
        let tokenizer = tokenizer();
        let integers = Encoding::Numeric {
            kind: ColumnKind::Integer,
            min: 1.0,
            max: 10.0,
            binning: Binning::Integer((1..=10).map(|v| (v, v)).collect()),
        };
        let domain = Domain {
            columns: vec![
                ColumnDomain { name: "n".into(), encoding: integers, missing: false },
                categorical(&["1", "10"], false),
            ],
        };
        let text = RowText::new(&domain, None, &tokenizer).unwrap();
        for bins in [[0, 0], [9, 1], [0, 1], [9, 0]] {
            walk(&text, &bins);
        }
        let id = |s: &str| -> Vec<u32> {
            tokenizer.encode(s).unwrap().iter().map(|t| text.vocabulary().binary_search(t).unwrap() as u32).collect()
        };
        // After " 1" in column n: " 10"'s continuation "0" and the separator "," are allowed.
        let mut cursor = text.cursor();
        for t in id("n is").into_iter().chain(id(" 1")) {
            cursor.advance(t).unwrap();
        }
        let mut allowed = cursor.allowed();
        allowed.sort_unstable();
        let mut want = [id("0")[0], id(",")[0]];
        want.sort_unstable();
        assert_eq!(allowed, want);
        assert_eq!(cursor.advance(id("n")[0]), Err(id("n")[0]));
    }

    /// Two bins that read alike are refused (a category named "missing" beside the missing
    /// bin).
    #[test]
    fn bins_that_read_alike_are_refused() {
        let domain = Domain { columns: vec![categorical(&["missing", "b"], true)] };
        let err = RowText::new(&domain, None, &tokenizer()).unwrap_err().to_string();
        assert!(err.contains("read alike"), "{err}");
    }

    /// With SmolLM2's own tokenizer (when the model file is there), every bin of Adult's
    /// columns reads and parses back.
    #[test]
    fn smollm2_tokenizes_every_adult_value_unambiguously() {
        let Ok(path) = std::env::var("RHOSYNTH_SMOLLM2_GGUF") else {
            eprintln!("SKIPPED: set RHOSYNTH_SMOLLM2_GGUF (.ci/run fetches it)");
            return;
        };
        let gguf = Gguf::parse(bytes::Bytes::from(std::fs::read(path).unwrap())).unwrap();
        let tokenizer = TextTokenizer::from_gguf(&gguf).unwrap();
        let (domain, target) = adult();
        let text = RowText::new(&domain, target, &tokenizer).unwrap();
        let lengths: Vec<usize> = every_bin(&domain).iter().map(|bins| walk(&text, bins).tokens.len()).collect();
        eprintln!("Adult rows in SmolLM2 tokens: {lengths:?}; vocabulary {}", text.vocabulary().len());
    }
}
