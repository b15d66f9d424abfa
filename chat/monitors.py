"""Monitors run on every participant message: crisis language, reassurance-seeking, dependence,
and sentiment (VADER's compound score, stored so analyses need not recompute it).

They are lexicons, fast and explainable: each finding names the cue that fired, and that cue is
stored with the turn. An optional LLM classifier (``crisis_classifier_model``) can run beside the
crisis lexicon through the gateway; see ``chat.service``. ``bench/crisis_lexicon.py`` measures
recall and false positives on ``tests/chat/data/crisis_messages.tsv``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Literal

from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

CrisisCategory = Literal["risk_to_self", "harm_to_others"]

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "`": "'"})


def normalize(text: str) -> str:
    return " ".join(text.translate(_APOSTROPHES).lower().split())


def _any(*patterns: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in patterns))


# Figures of speech that contain crisis words; removed before the crisis patterns run.
_IDIOMS = _any(
    r"\b(?:is|are|was|'s|'re|were|be|been) (?:literally |absolutely |slowly |just )?killing me\b",
    r"\b(?:kill|killing|killed) (?:some )?time\b",
    r"\bkill(?:ed|ing)? it\b",
    r"\bkill(?:ed|ing)? (?:the|a|my|this) (?:lights?|engine|process|task|app|tab|bug|mood|vibe|battery|plant)s?\b",
    r"\bkiller\b",
    r"\b(?:that|it|this|you|he|she|they) (?:just |totally |literally )?killed me\b",
    r"\bdying (?:to|for)\b",
    r"\bto die for\b",
    r"\bdie (?:of|from) (?:embarrassment|laughter|boredom|shame|curiosity)\b",
    r"\b(?:bored|scared|worried|tickled|loved?|freezing|starving|frightened) to death\b",
    r"\b(?:battery|phone|laptop|car|plant|plants|houseplant|printer|wifi|server|engine)s? (?:has |have |is |just )?(?:died|dead|dying)\b",
    r"\b(?:dead|deadly) (?:tired|serious|boring|line|end|heat|set)\b",
    r"\bdrop dead\b",
    r"\bshoot (?:me|us|him|her|them) (?:an?|the|your) (?:email|message|text|note|line|dm)\b",
    r"\bshoot(?:ing)? (?:photos|a video|hoops|pool|the breeze|for the stars|my shot)\b",
    r"\bcould (?:just )?(?:kill|murder) (?:for|a|an|some)\b",
    r"\bmurder(?:ed|ing)? (?:a|an|some|the) (?:burger|pizza|sandwich|song|karaoke)s?\b",
    r"\b(?:overdose|overdosed|od'd) on (?:coffee|caffeine|sugar|chocolate|netflix|tv|memes)\b",
    r"\bhurts? my (?:brain|head|eyes|feelings)\b",
    r"\b(?:muscles?|legs?|back|feet|knee|head) (?:hurt|hurts|are hurting|is hurting)\b",
    r"\bkill(?:ing)? (?:the|this) (?:deal|project|idea|meeting|feature)\b",
    r"\bsuicide (?:squad|doors?|run|mission|prevention|awareness|rates?|statistics|research)\b",
    r"\b(?:beat|beating) (?:him|her|them|me|you|my \w+) (?:at|in) \w+",
    r"\b(?:attack|attacking) (?:the|this) (?:problem|task|backlog|day)\b",
    r"\bwhen i die\b.*\b(?:will|estate|pension|insurance)\b",
)

_SELF_ACUTE = _any(
    r"\bkill(?:ing)? my ?self\b", r"\bend(?:ing)? (?:my|it) (?:own )?life\b", r"\bend(?:ing)? it all\b",
    r"\btake my (?:own )?life\b", r"\bsuicid(?:e|al)\b", r"\b(?:want|wanna|going|ready|wish i could) (?:to )?die\b",
    r"\bwish i (?:was|were) dead\b", r"\bbetter off dead\b", r"\b(?:better|easier) off without me\b",
    r"\bdon't want to (?:be alive|live|exist|wake up)\b", r"\bno (?:reason|point) (?:to|in) (?:live|living|go on)\b",
    r"\b(?:hurt|hurting|harm|harming|cut|cutting|burn|burning) my ?self\b", r"\bself[- ]?harm",
    r"\boverdos(?:e|ing)\b", r"\b(?:hang|hanging|drown|drowning|shoot|shooting) my ?self\b",
    r"\bjump(?:ing)? (?:off|from|in front of) (?:a|the|my)\b", r"\bcan't go on\b",
    r"\bnot (?:be|being) (?:here|around) (?:anymore|much longer|tomorrow)\b",
    r"\b(?:saved|saving|stockpil\w*|collect\w*) (?:up )?(?:pills|my meds|medication)\b",
    r"\bgoodbye (?:note|letter)\b", r"\b(?:nobody|no one|anyone) (?:would|will) (?:even )?(?:miss|notice|care)\b.{0,30}"
    r"\b(?:me|i(?:'m| was| were)? gone|disappeared)\b", r"\bwon't be (?:here|around) (?:much longer|anymore|for long)\b",
    r"\b(?:plan|plans|planning|method) to (?:die|end it)\b", r"\bdisappear(?:ed)? forever\b",
    r"\b(?:feel|felt|feeling) like dying\b", r"\bpainless(?:ly)? (?:way )?to (?:go|die|end)\b",
    r"\b(?:said|say|saying) (?:all )?(?:my goodbyes|goodbye to (?:everyone|everybody|the world))\b",
    r"\bend(?:ing)? things\b(?! (?:with|between|off))", r"\buntil (?:it|they|i) bled\b",
    r"\b(?:took|taken|swallowed) (?:a (?:bunch|lot|handful)|all) (?:of )?(?:my |the )?(?:\w+ )?(?:pills|tablets|meds)\b",
    r"\b(?:easier|better) (?:for everyone )?if i (?:just )?(?:wasn't|weren't|was not|were not) (?:here|around|alive)\b",
    r"\bdriv\w* .{0,20}into .{0,25}on purpose\b",
    r"\b(?:giving|gave|give) (?:away )?(?:all )?my (?:things|stuff|belongings|possessions)(?: away)?\b.{0,40}\b(?:won't|will not|don't|no longer) need\b",
    r"\b(?:tonight|today) is the (?:night|day)\b.{0,30}\b(?:decided|ready|goodbye|it ends)\b",
    r"\b(?:looked|looking|look) up how (?:high|tall|far down|deep)\b",
    r"\b(?:can't stop|keep|always) (?:thinking|think) (?:about|of) (?:dying|death|killing myself|ending it|not being here)\b",
    r"\bwant (?:everything|it all|the pain|life) to (?:stop|end),? (?:forever|for good|permanently)\b",
    r"\b(?:punched|hit|cut|burned|hurt) (?:the wall|myself|my \w+) until\b.{0,40}\b(?:deserved|deserve) it\b",
)
_SELF_CONCERN = _any(
    r"\bhopeless\b", r"\bcan't (?:take|do|handle) (?:it|this|anything) any ?more\b", r"\bwhat's the point of anything\b",
    r"\b(?:i'm|i am|i feel) (?:so )?worthless\b", r"\b(?:i'm|i am) a burden\b", r"\btrapped with no way out\b",
    r"\bhaven't (?:eaten|slept) in (?:days|a week)\b", r"\bempty inside\b", r"\bfalling apart\b",
    r"\b(?:want|wanted) to disappear\b", r"\bhate myself\b",
)
_OTHERS_ACUTE = _any(
    r"\b(?:kill|murder|stab|shoot|strangle|poison|hurt|beat up|attack|choke|punch|hit|slap|kick)(?! up\b) "
    r"(?:him|her|them|you|someone|somebody|people|everyone|my (?:\w+ ){0,2}?(?:wife|husband|partner|boss|dad|father|"
    r"mom|mother|son|daughter|brother|sister|neighbou?r|coworker|colleague|ex|roommate|kid|kids|child|teacher|"
    r"family|classmates?|manager|landlord|girlfriend|boyfriend|stepdad|stepmom))\b(?! (?:up|at \w+)\b)",
    r"\bi know where (?:he|she|they) (?:sleeps?|lives?)\b",
    r"\b(?:find|found|find out) (?:out )?where (?:he|she|they) (?:lives?|sleeps?|works?)\b.{0,30}\b(?:show up|go there|wait for)\b",
    r"\b(?:run|ran|running) (?:him|her|them) (?:over|down)\b",
    r"\b(?:thinking about|thoughts of|urge to|want to) (?:hurting|harming|hurt|harm|shaking|smothering) (?:the|my) (?:baby|child|kid|kids|son|daughter)\b", r"\bburn (?:his|her|their) (?:house|home|car|place|stuff)\b",
    r"\b(?:bring|take|get|buy)(?:ing)? (?:a|my) (?:gun|knife|weapon|rifle|pistol) (?:to|into|and)\b",
    r"\bmake (?:him|her|them) (?:bleed|suffer|disappear)\b", r"\bthey(?:'ll| will) (?:all )?be sorry when\b",
    r"\bshoot up (?:the|my)\b", r"\bbomb (?:the|my)\b",
)
_OTHERS_CONCERN = _any(
    r"\bget (?:back|even) at (?:him|her|them|my|our|that|this|these|those|the (?:guy|girl|man|woman|person|people))\b",
    r"\b(?:i|we)\b(?:'m| am| want| need| will|'ll| plan| am going)?.{0,25}\brevenge\b", r"\bhumiliate (?:him|her|them)\b",
    r"\bruin (?:his|her|their) (?:life|career|reputation|marriage)\b", r"\bspread(?:ing)? (?:a )?rumou?rs?\b",
    r"\b(?:post|share|leak|send)(?:ing)? (?:his|her|their) (?:private|nude|intimate|naked)\b", r"\bdox(?:x)?(?:ing)?\b",
    r"\bstalk(?:ing)? (?:him|her|them|my)\b", r"\bteach (?:him|her|them) a lesson\b",
    r"\bthreaten(?:ing)? (?:him|her|them|my)\b", r"\bmake (?:him|her|them|my \w+) pay\b",
    r"\b(?:get|break|hack|log) into (?:his|her|their|my (?:ex|wife|husband|partner|boyfriend|girlfriend)'s) "
    r"(?:email|phone|account|accounts|messages)\b",
    r"\b(?:slash|key|keying) (?:his|her|their) (?:tires|car)\b",
)


@dataclass(frozen=True)
class CrisisFinding:
    category: CrisisCategory
    acute: bool
    cue: str
    source: str = "lexicon"


def detect_crisis(text: str) -> CrisisFinding | None:
    """The most serious crisis cue in a message, or None. Acute findings escalate at once."""
    cleaned = _IDIOMS.sub(" ", normalize(text))
    for pattern, category, acute in (
        (_SELF_ACUTE, "risk_to_self", True), (_OTHERS_ACUTE, "harm_to_others", True),
        (_OTHERS_CONCERN, "harm_to_others", False), (_SELF_CONCERN, "risk_to_self", False),
    ):
        match = pattern.search(cleaned)
        if match:
            return CrisisFinding(category=category, acute=acute, cue=match.group(0))  # type: ignore[arg-type]
    return None


_REASSURANCE = _any(
    r"\b(?:am i|was i|i'm|i am) (?:doing|making) the right (?:thing|choice|decision)\b",
    r"\b(?:did|have) i (?:do|done|make|made) (?:the right|something wrong|a mistake|the wrong)\b",
    r"\b(?:is|was|isn't|would) (?:it|that|this) (?:ok|okay|normal|fine|alright|all right|bad|wrong)\b",
    r"\btell me (?:it(?:'ll| will)|i(?:'m| am| will)|that|everything)\b",
    r"\b(?:do|don't) you think (?:i|he|she|they|it|we)\b", r"\bare you sure\b", r"\breassure me\b",
    r"\bpromise (?:me|it)\b", r"\bwas i wrong\b", r"\b(?:am i|i'm not) (?:a bad|overreacting|crazy|being unreasonable)",
    r"\bdoes (?:he|she|they) (?:still )?(?:like|love|hate|care about) me\b", r"\bwill (?:it|everything) be (?:ok|okay|fine|alright)\b",
    r"\b(?:right|isn't it|won't it|don't you think)\s*\?\s*$",
)
_DEPENDENCE = _any(
    r"\byou(?:'re| are) the only (?:one|person|thing|friend)\b", r"\bonly you (?:understand|get|listen)\b",
    r"\bcan't (?:decide|do|choose) (?:anything|a thing) without (?:you|asking you)\b",
    r"\b(?:just )?(?:tell me what to do|decide for me|you decide|make the decision for me|choose for me)\b",
    r"\byou understand me better than\b", r"\bdon't need (?:anyone|anybody|people|friends) (?:else|now|anymore)\b",
    r"\btalk(?:ing)? to you instead of\b", r"\b(?:need|have) to (?:ask|check with) you (?:before|first)\b",
    r"\byou(?:'re| are) my (?:best|only) friend\b",
)
_STOPWORD_TEXT = """
a an the i i'm im me my you your it it's its is am are was were be been do does did to of in on at for and or but
if so that this with about just really ok okay right think tell please again still can could would should will what
how why when don't isn't not
"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_WORD = re.compile(r"[a-z']+")


def reassurance_cue(text: str) -> str | None:
    match = _REASSURANCE.search(normalize(text))
    return match.group(0) if match else None


def dependence_cue(text: str) -> str | None:
    match = _DEPENDENCE.search(normalize(text))
    return match.group(0) if match else None


@cache
def _vader() -> SentimentIntensityAnalyzer:
    return SentimentIntensityAnalyzer()


def sentiment(text: str) -> float:
    """VADER compound sentiment, -1 (most negative) to 1 (most positive)."""
    return float(_vader().polarity_scores(text)["compound"])


def content_words(text: str) -> frozenset[str]:
    """The words that say what a reassurance request is about, for spotting the same one again."""
    return frozenset(w.strip("'") for w in _WORD.findall(normalize(text)) if w not in _STOPWORDS and len(w) > 2)


def similar(a: frozenset[str], b: frozenset[str], threshold: float = 0.4) -> bool:
    if not a or not b:
        return False
    return len(a & b) / len(a | b) >= threshold
