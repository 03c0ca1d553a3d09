import pytest
from hypothesis import given
from hypothesis import strategies as st

from haystack_fusion.answers import UnknownDetector
from haystack_fusion.notes import (
    CONTEXT,
    DIRECT,
    IRRELEVANT,
    RELEVANCE_LABELS,
    ParsedNotes,
    classify_note,
    parse_document_note,
    parse_single_call,
)

# Yu et al., Appendix A.6, Table 6: the two "RALM with CHAIN-OF-NOTE" outputs, verbatim.
CASE_1_NOTES = [
    "Wikipedia passage #1 discusses Chicago's bid for the 2016 Summer Olympics, but does not mention whether it is a "
    "successful bid.",
    "Wikipedia passage #2 confirms that the 1996 Summer Olympics were the most recent edition of the Summer Olympics "
    "to be held in the United States.",
]
CASE_1 = " ".join(CASE_1_NOTES) + " Based on the information given in above passages, the answer is 1996"
CASE_2_NOTES = [
    "Wikipedia passage #1 states that the first Jnanpith Award was given to G. Sankara Kurup in 1965 for his "
    "collection of poems, Odakkuzhal.",
    "Wikipedia passage #2 mentions that the Jnanpith Award was given to G. Sankara Kurup in 1966 for his work in "
    "Malayalam.",
]
CASE_2 = " ".join(CASE_2_NOTES) + " Based on the information given in above passages, the answer is Malayalam"

# Pieces of real replies, mixed with arbitrary text by the property-based tests.
# fmt: off
REPLY_PIECES = [
    "Passage #1", "passage 2", "Passages #2-#4", "Passages #1 and #3", "[3]", "Document #9", "No. 2", " and ", ", ",
    ". ", "; ", "\n", ":", "-", "#", "the answer is", "The answer", " is ", "Answer:", "Final answer:", "Based on x, ",
    " so ", "Question:", "Reading notes:", "Relevance:", "(a)", "(b) useful context", "c)", "irrelevant", "not",
    "does not mention", "1996", "unknown", ".", '"',
]
# fmt: on
replies = st.one_of(
    st.none(), st.text(), st.lists(st.one_of(st.sampled_from(REPLY_PIECES), st.text(max_size=5))).map("".join)
)


class TestParseSingleCall:
    @pytest.mark.parametrize(
        ("reply", "notes", "answer"),
        [
            pytest.param(CASE_1, CASE_1_NOTES, "1996", id="table-6-case-1"),
            pytest.param(CASE_2, CASE_2_NOTES, "Malayalam", id="table-6-case-2"),
        ],
    )
    def test_table_6(self, reply, notes, answer):
        parsed = parse_single_call(reply, 5)
        assert parsed == ParsedNotes(notes=[*notes, "", "", ""], answer=answer, mentioned=[True, True] + [False] * 3)

    @pytest.mark.parametrize(
        ("reply", "notes", "answer"),
        [
            pytest.param(
                "Passage #1: Chicago's bid.\nPassage #2: The 1996 games.\nPassage #3: Football.\nAnswer: 1996",
                ["Passage #1: Chicago's bid.", "Passage #2: The 1996 games.", "Passage #3: Football."],
                "1996",
                id="one-note-per-line",
            ),
            pytest.param(
                "Passage 1 is a bid. Passage 3 is 1996.",
                ["Passage 1 is a bid.", "", "Passage 3 is 1996."],
                "",
                id="no-hash-no-answer",
            ),
            pytest.param(
                "passage #2 says 1996. the answer is 1996.", ["", "passage #2 says 1996.", ""], "1996", id="lower-case"
            ),
            pytest.param(
                "Document #2 is about the games.", ["", "Document #2 is about the games.", ""], "", id="document"
            ),
            pytest.param(
                "[1] A bid. [3] The 1996 games.\nFinal answer: 1996.",
                ["[1] A bid.", "", "[3] The 1996 games."],
                "1996",
                id="brackets-final-answer",
            ),
            pytest.param(
                "Wikipedia passage #3 covers 1996.",
                ["", "", "Wikipedia passage #3 covers 1996."],
                "",
                id="wikipedia-passage",
            ),
            pytest.param(
                "Passages #1 and #3 both say 1996. Passage #2 is irrelevant. The answer is 1996",
                ["Passages #1 and #3 both say 1996.", "Passage #2 is irrelevant.", "Passages #1 and #3 both say 1996."],
                "1996",
                id="merged-passages",
            ),
            pytest.param(
                "Passage #1 is a bid. Passages #2-#3 are about 1996.",
                ["Passage #1 is a bid.", "Passages #2-#3 are about 1996.", "Passages #2-#3 are about 1996."],
                "",
                id="range",
            ),
            pytest.param(
                "Passage #1 is a bid. It failed. Passage #7 is odd. It is long. Passage #2 - 1996 Summer Olympics.",
                ["Passage #1 is a bid. It failed.", "Passage #2 - 1996 Summer Olympics.", ""],
                "",
                id="continuation-and-number-beyond-k",
            ),
            pytest.param("Passage No. 2 says 1996.", ["", "Passage No. 2 says 1996.", ""], "", id="passage-no"),
            pytest.param("The answer is 1996.", ["", "", ""], "1996", id="no-notes"),
            pytest.param(
                "Here are my notes.\nPassage #2 says 1996.",
                ["", "Passage #2 says 1996.", ""],
                "",
                id="preamble-dropped",
            ),
            pytest.param(
                "Reading notes: Passage #1 says 1996.", ["Passage #1 says 1996.", "", ""], "", id="reading-notes-echo"
            ),
            pytest.param(
                "Passage #2 confirms 1996, so the answer is 1996.",
                ["", "Passage #2 confirms 1996", ""],
                "1996",
                id="answer-clause-inside-note",
            ),
            pytest.param(
                "Passage #1 is a bid. The answer is unknown.", ["Passage #1 is a bid.", "", ""], "unknown", id="unknown"
            ),
            pytest.param(
                "Passage #2 says 1996. The answer is 1996.\n\nQuestion: Who won?\nPassage #1 says Bob. "
                "The answer is Bob",
                ["", "Passage #2 says 1996.", ""],
                "1996",
                id="continuation-after-answer",
            ),
            pytest.param(
                "Passage #1 hints 2016, the answer is 2016?\nFinal answer: '1996'.",
                ["Passage #1 hints 2016", "", ""],
                "1996",
                id="last-marker-wins",
            ),
            pytest.param(
                "Passage #2 says 1996.\nAnswer:\n**1996**",
                ["", "Passage #2 says 1996.", ""],
                "1996",
                id="answer-on-next-line",
            ),
            pytest.param("Passage #2 says 1996.\nAnswer:", ["", "Passage #2 says 1996.", ""], "", id="empty-answer"),
            pytest.param(
                "Passage #1 said the answer\nis 1996", ["Passage #1 said", "", ""], "1996", id="marker-across-lines"
            ),
        ],
    )
    def test_messy_replies(self, reply, notes, answer):
        parsed = parse_single_call(reply, 3)
        assert parsed.notes == notes
        assert parsed.answer == answer
        assert parsed.mentioned == [bool(note) for note in notes]

    @pytest.mark.parametrize("reply", [None, "", "   \n"])
    def test_empty_reply(self, reply):
        assert parse_single_call(reply, 2) == ParsedNotes(notes=["", ""], answer="", mentioned=[False, False])

    def test_k_zero_still_reads_the_answer(self):
        assert parse_single_call(CASE_1, 0) == ParsedNotes(notes=[], answer="1996", mentioned=[])

    def test_negative_k_raises(self):
        with pytest.raises(ValueError, match="must not be negative"):
            parse_single_call(CASE_1, -1)


class TestParseDocumentNote:
    NOTE = "The passage discusses Chicago's bid for the 2016 Summer Olympics."

    @pytest.mark.parametrize(
        ("label", "expected"),
        [
            ("(a)", DIRECT),
            ("a)", DIRECT),
            ("(A) answers directly", DIRECT),
            ("answers the question directly", DIRECT),
            ("Directly", DIRECT),
            ("(b) useful context", CONTEXT),
            ("b.", CONTEXT),
            ("context", CONTEXT),
            ("Useful Context.", CONTEXT),
            ("not directly, but useful", CONTEXT),
            ("(c) irrelevant", IRRELEVANT),
            ("C", IRRELEVANT),
            ("Not relevant", IRRELEVANT),
            ("IRRELEVANT", IRRELEVANT),
            ("(b) irrelevant", CONTEXT),  # the letter decides
            ("(a) answers directly, (b) useful context, or (c) irrelevant", None),  # an echo of the choices
            ("maybe", None),
            ("", None),
        ],
    )
    def test_label_variants(self, label, expected):
        assert parse_document_note(f"{self.NOTE}\nRelevance: {label}") == (self.NOTE, expected)

    @pytest.mark.parametrize(
        ("reply", "expected"),
        [
            pytest.param(
                "The passage discusses X.\nRelevance: (b) useful context\n\nQuestion: Y?\nReading note: Z",
                ("The passage discusses X.", CONTEXT),
                id="continuation-dropped",
            ),
            pytest.param("The passage discusses X.", ("The passage discusses X.", None), id="no-label-line"),
            pytest.param(
                "The passage\n discusses X. **Relevance:** (a)",
                ("The passage discusses X.", DIRECT),
                id="inline-markdown",
            ),
            pytest.param(
                "The passage is about Y.\n(c) irrelevant", ("The passage is about Y.", IRRELEVANT), id="label-only-line"
            ),
            pytest.param(
                "The passage says 1996.\nRelevance:\n(a) answers directly",
                ("The passage says 1996.", DIRECT),
                id="label-on-next-line",
            ),
            pytest.param(
                "Relevance: (c)\nThe passage is about Y.", ("The passage is about Y.", IRRELEVANT), id="label-first"
            ),
            pytest.param("Reading note: X.", ("X.", None), id="echo-removed"),
            pytest.param(None, ("", None), id="none"),
            pytest.param("", ("", None), id="empty"),
        ],
    )
    def test_reply_shapes(self, reply, expected):
        assert parse_document_note(reply) == expected


class TestClassifyNote:
    @pytest.mark.parametrize(
        ("notes", "answer", "expected"),
        [
            pytest.param(CASE_1_NOTES, "1996", [CONTEXT, DIRECT], id="table-6-case-1"),
            pytest.param(CASE_2_NOTES, "Malayalam", [CONTEXT, DIRECT], id="table-6-case-2"),
        ],
    )
    def test_table_6(self, notes, answer, expected):
        assert [classify_note(note, answer) for note in notes] == expected

    @pytest.mark.parametrize(
        ("note", "answer", "expected"),
        [
            pytest.param("", "1996", IRRELEVANT, id="empty"),
            pytest.param("Passage #3 is irrelevant.", "1996", IRRELEVANT, id="irrelevant"),
            pytest.param(
                "Passage #3 is about the 1996 Paralympics, not related to the question.",
                "1996",
                IRRELEVANT,
                id="verdict-beats-answer",
            ),
            pytest.param("Passage #3 contains no relevant information.", "1996", IRRELEVANT, id="no-information"),
            pytest.param("Passage #3 does not mention the Olympics.", "1996", IRRELEVANT, id="negative-only"),
            pytest.param("Passage #3 isn't about it and has nothing on the bid.", "", IRRELEVANT, id="negative-no-ans"),
            pytest.param(
                "Passage #1 is not directly relevant but describes the bid.",
                "1996",
                CONTEXT,
                id="not-directly-relevant",
            ),
            pytest.param("Passage #1: The games were held in Atlanta.", "1996", CONTEXT, id="context"),
            pytest.param("Passage #2: 1996 games; 2016 is not mentioned.", "1996", DIRECT, id="answer-and-negation"),
            pytest.param(
                "The 1996 summer Olympics, in Atlanta.", "the 1996 Summer Olympics.", DIRECT, id="normalized-answer"
            ),
            pytest.param("Held in 19961.", "1996", CONTEXT, id="whole-tokens-only"),
            pytest.param("The answer is unknown, it is about 1996.", "unknown", CONTEXT, id="unknown-answer"),
            pytest.param("Passage No. 2 mentions Paris.", "", CONTEXT, id="passage-no-is-no-negation"),
            pytest.param("Passage #2 is about the bid.", "2", CONTEXT, id="reference-is-not-the-answer"),
            pytest.param("Passage #2:", "1996", IRRELEVANT, id="reference-only"),
        ],
    )
    def test_rules(self, note, answer, expected):
        assert classify_note(note, answer) == expected

    def test_custom_detector(self):
        detector = UnknownDetector(patterns=(r"^1996$",))
        assert classify_note(CASE_1_NOTES[1], "1996", detector) == CONTEXT


class TestProperties:
    @given(reply=replies, k=st.integers(min_value=0, max_value=8))
    def test_single_call_shape(self, reply, k):
        parsed = parse_single_call(reply, k)
        assert len(parsed.notes) == len(parsed.mentioned) == k
        assert all(mentioned or not note for note, mentioned in zip(parsed.notes, parsed.mentioned, strict=True))
        assert all("the answer is" not in note.lower() for note in parsed.notes)
        assert "\n" not in parsed.answer

    @given(reply=replies)
    def test_document_note_never_raises(self, reply):
        note, label = parse_document_note(reply)
        assert isinstance(note, str)
        assert label is None or label in RELEVANCE_LABELS

    @given(note=replies.map(lambda text: text or ""), answer=replies.map(lambda text: text or ""))
    def test_classify_never_raises(self, note, answer):
        assert classify_note(note, answer) in RELEVANCE_LABELS
