//! A CSV file cut into byte ranges at record boundaries, so that different workers read its
//! shards (`data::shard`). Ranges are cut only after a line feed outside quotes: a range
//! holds the records of the lines that start in it. A range's reader cannot know whether
//! its first bytes lie inside a quoted field that spans lines, so it takes the first line
//! start in its range as its first record's ([`RecordCut`] seeking); the reader of the range
//! before it, which started at a record it knew, reads on past its range's end to the end of
//! its last record. Where the two offsets differ the guess was wrong, and the coordinator
//! reads that file whole instead (`shuffle`). Where they agree the guess was right, since
//! both readers then start from the same record. A reader reads at most a range's length
//! past its end: a wrong guess can take the quote that closes a field for one that opens
//! it, and would otherwise read on to the file's end.

/// Where a byte is in the records, as `csv_core` (arrow-csv's parser, with the dialect
/// rhosynth sets) reads them: `"` quotes a field that starts with it (`""` inside is one
/// quote), `\r` and `\n` end a record outside quotes, and a comment line ends at `\n` only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    RecordStart,
    FieldStart,
    InField,
    Quoted,
    QuoteInQuoted,
    Comment,
}

const QUOTE: u8 = b'"';

impl State {
    fn next(self, byte: u8, delimiter: u8, comment: Option<u8>) -> State {
        use State::*;
        match self {
            RecordStart if comment == Some(byte) => Comment,
            Comment if byte == b'\n' => RecordStart,
            Comment => Comment,
            Quoted if byte == QUOTE => QuoteInQuoted,
            Quoted => Quoted,
            QuoteInQuoted if byte == QUOTE => Quoted,
            RecordStart | FieldStart if byte == QUOTE => Quoted,
            _ if byte == b'\r' || byte == b'\n' => RecordStart,
            _ if byte == delimiter => FieldStart,
            _ => InField,
        }
    }
}

/// The records of one byte range `[start, end)` of a file, cut from the bytes read from just
/// before it to past its end, chunk by chunk ([`Self::take`]).
#[derive(Debug)]
pub struct RecordCut {
    delimiter: u8,
    comment: Option<u8>,
    /// The file offset of the next byte fed.
    at: u64,
    end: u64,
    /// The file's size.
    size: u64,
    /// Discarding bytes up to the first line start.
    seeking: bool,
    state: State,
    /// The file offset of the range's first record.
    first: Option<u64>,
    /// Where the range's last record ends, once a record starts at or past `end`.
    last: Option<u64>,
}

impl RecordCut {
    /// The records starting in `[start, end)` of a file of `size` bytes whose records start
    /// at `data_start` (after its header). Returns the cut and the bytes to read: from the
    /// first record's offset when the range holds the data's start, else from the byte
    /// before `start` (a line that starts exactly at `start` follows a `\n` there), to at
    /// most the range's length past its end.
    pub fn new(
        (start, end): (u64, u64),
        data_start: u64,
        size: u64,
        delimiter: u8,
        comment: Option<u8>,
    ) -> (Self, std::ops::Range<u64>) {
        let seeking = start > data_start;
        let from = if seeking { start - 1 } else { data_start };
        let to = size.min(end.saturating_add(end - start)).max(from);
        let state = State::RecordStart;
        let mut cut = Self { delimiter, comment, at: from, end, size, seeking, state, first: None, last: None };
        if !seeking {
            cut.record_starts_at(from);
        }
        (cut, from..to)
    }

    fn record_starts_at(&mut self, offset: u64) {
        self.first.get_or_insert(offset);
        if offset >= self.end {
            self.last = Some(offset);
        }
    }

    /// The part of `chunk`, the file's next bytes, that holds the range's records.
    pub fn take<'a>(&mut self, chunk: &'a [u8]) -> &'a [u8] {
        let base = self.at;
        self.at += chunk.len() as u64;
        if self.last.is_some() {
            return &[];
        }
        let mut begin = 0;
        if self.seeking {
            let Some(newline) = chunk.iter().position(|&b| b == b'\n') else {
                return &[];
            };
            self.seeking = false;
            begin = newline + 1;
            self.record_starts_at(base + begin as u64);
            if self.last.is_some() {
                return &[];
            }
        }
        for (i, &byte) in chunk.iter().enumerate().skip(begin) {
            self.state = self.state.next(byte, self.delimiter, self.comment);
            let next = base + i as u64 + 1;
            if byte == b'\n' && self.state == State::RecordStart && next >= self.end {
                self.last = Some(next);
                return &chunk[begin..=i];
            }
        }
        &chunk[begin..]
    }

    /// Whether the range's last record has ended (nothing more is to be read).
    pub fn is_done(&self) -> bool {
        self.last.is_some()
    }

    /// Once the bytes [`Self::new`] named are read: the file offsets of the range's first
    /// record and of the end of its last (the file's end where it came first: then the range
    /// holds no record, or its last one ends the file); `None` where they ended before that
    /// record did.
    pub fn span(&self) -> Option<(u64, u64)> {
        let end = self.last.or((self.at == self.size).then_some(self.size))?;
        Some((self.first.unwrap_or(end), end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The records and span of each range of `size` bytes of `text` (records from
    /// `data_start`), fed `chunk` bytes at a time.
    type Ranges = Vec<(Vec<u8>, Option<(u64, u64)>)>;

    fn cut(text: &[u8], data_start: u64, size: u64, chunk: usize) -> Ranges {
        let len = text.len() as u64;
        let mut ranges = Vec::new();
        for start in (0..len).step_by(size as usize) {
            let range = (start, (start + size).min(len));
            let (mut cut, read) = RecordCut::new(range, data_start, len, b',', Some(b'#'));
            let mut records = Vec::new();
            for piece in text[read.start as usize..read.end as usize].chunks(chunk) {
                records.extend_from_slice(cut.take(piece));
                if cut.is_done() {
                    break;
                }
            }
            ranges.push((records, cut.span()));
        }
        ranges
    }

    /// Whether every range has its span and each starts where the one before it ended.
    fn joined(ranges: &Ranges) -> bool {
        let spans: Option<Vec<(u64, u64)>> = ranges.iter().map(|(_, span)| *span).collect();
        spans.is_some_and(|spans| spans.windows(2).all(|pair| pair[0].1 == pair[1].0))
    }

    /// The longest line of `text`, its line feed included.
    fn longest_line(text: &[u8]) -> u64 {
        text.split_inclusive(|&b| b == b'\n').map(|line| line.len() as u64).max().unwrap_or(0)
    }

    /// Every range size and chunk size: where the ranges join, their records are the
    /// file's; with ranges no shorter than its longest line, they always join (no quoted
    /// field spans lines), and each range's first record starts in it. Quotes inside a
    /// field, `""`, CRLF, a lone CR, a comment with a CR and a quote in it, a blank line, a
    /// byte-order mark inside a record and a last line without its line feed.
    #[test]
    fn ranges_of_a_file_without_multiline_fields_join_into_its_records() {
        let header = b"id,note,x\n".as_slice();
        let data =
            b"1,\"a, \"\"quoted\"\" b\",3\r\n2,plain,4\rx,y,z\n# a comment\r\"odd\n3,x\"y,5\n\n\xef\xbb\xbf4,\"\",6"
                .as_slice();
        let text = [header, data].concat();
        let (data_start, longest) = (header.len() as u64, longest_line(&text));
        for size in 1..=text.len() as u64 {
            for chunk in [1, 2, 7, 64] {
                let ranges = cut(&text, data_start, size, chunk);
                if !joined(&ranges) {
                    assert!(size < longest, "ranges of {size} bytes, chunk {chunk}, do not join");
                    continue;
                }
                let records: Vec<u8> = ranges.iter().flat_map(|(records, _)| records.clone()).collect();
                assert_eq!(records, data, "size {size}, chunk {chunk}");
                assert_eq!(ranges.last().unwrap().1.unwrap().1, text.len() as u64);
                for (k, (records, span)) in ranges.iter().enumerate() {
                    let first = span.unwrap().0;
                    if !records.is_empty() {
                        assert!(first >= (k as u64 * size).max(data_start) && first < (k as u64 + 1) * size);
                    }
                }
            }
        }
    }

    /// A quoted field across lines: a range starting inside it guesses a record start that
    /// the range before it does not end at, and only there.
    #[test]
    fn a_range_starting_inside_a_multiline_field_does_not_join() {
        let text = b"1,\"first line\nsecond line\",2\n3,plain,4\n".as_slice();
        let inside = text.windows(6).position(|w| w == b"second").unwrap() as u64 - 3;
        let ranges = cut(text, 0, inside, 64);
        assert_eq!(ranges[1].1.unwrap().0, inside + 3, "the second range's guess is inside the quotes");
        assert!(!joined(&ranges));
        // Cut where no quoted field spans the boundary, the ranges join.
        let ranges = cut(text, 0, 30, 64);
        assert!(joined(&ranges));
        let records: Vec<u8> = ranges.iter().flat_map(|(records, _)| records.clone()).collect();
        assert_eq!(records, text);
    }

    /// A guess that takes a closing quote for an opening one reads no further than a
    /// range's length past its end, and has no span; so does a line longer than that.
    #[test]
    fn a_reader_stops_a_ranges_length_past_its_end() {
        let mut text = b"a,\"ends in a line feed\n\",b\n".to_vec();
        text.extend(b"c,d,e\n".repeat(1000));
        let boundary = text.iter().position(|&b| b == b'\n').unwrap() as u64 - 2;
        let (mut cut, read) = RecordCut::new((boundary, boundary + 16), 0, text.len() as u64, b',', None);
        assert_eq!(read, boundary - 1..boundary + 32);
        cut.take(&text[read.start as usize..read.end as usize]);
        assert_eq!(cut.span(), None);
        let line = [b"x".repeat(100), b"\n".to_vec()].concat();
        let (mut cut, read) = RecordCut::new((0, 10), 0, line.len() as u64, b',', None);
        cut.take(&line[read.start as usize..read.end as usize]);
        assert_eq!((read, cut.span()), (0..20, None));
    }
}
