"""Monitors run on every participant message: crisis language (risk to self, danger from someone
else, harm to others), reassurance-seeking, validation-seeking, dependence, and sentiment (VADER's
compound score, stored so analyses need not recompute it).

They are lexicons, fast and explainable: each finding names the cue that fired, and that cue is
stored with the turn. An optional LLM reader (``llm_reader_model``, ``chat.llm_reader``) can add
to what they and the local reading find, through the gateway. ``bench/crisis_lexicon.py`` measures
recall and false positives on ``tests/chat/data/crisis_messages.tsv``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Literal

from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

CrisisCategory = Literal["risk_to_self", "harm_to_others", "risk_from_others"]

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
    r"\bhang(?:ing)? (?:\w+ )?out to dry\b",
    r"\b(?:ate|eaten|eat|eating) (?:so|too) much\b[^.!?]{0,40}\b(?:want to|could|gonna|going to) die\b",
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
_PEOPLE = (r"(?:wife|husband|partner|boss|dad|father|mom|mother|son|daughter|brother|sister|neighbou?r|coworker|"
           r"colleague|ex|roommate|kid|kids|child|teacher|family|classmates?|manager|landlord|girlfriend|boyfriend|"
           r"stepdad|stepmom)")
_OTHERS_ACUTE = _any(
    r"\b(?:kill|murder|stab|shoot|strangle|poison|hurt|beat up|attack|choke|punch|hit|slap|kick)(?! up\b) "
    rf"(?:him|her|them|you|someone|somebody|people|everyone|my (?:\w+ ){{0,2}}?{_PEOPLE})\b(?! (?:up|at \w+)\b)",
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
    r"\bruin (?:his|her|their|my \w+'s|someone's|somebody's) (?:life|career|reputation|marriage|relationship|business)\b", r"\bspread(?:ing)? (?:a )?rumou?rs?\b",
    r"\b(?:post|share|leak|send)(?:ing)? (?:his|her|their) (?:private|nude|intimate|naked)\b", r"\bdox(?:x)?(?:ing)?\b",
    r"\bstalk(?:ing)? (?:him|her|them|my)\b", r"\bteach (?:him|her|them) a lesson\b",
    r"\bthreaten(?:ing)? (?:him|her|them|my)\b", r"\bmake (?:him|her|them|my \w+) pay\b",
    r"\b(?:get|break|hack|log) into (?:his|her|their|my (?:ex|wife|husband|partner|boyfriend|girlfriend)'s) "
    r"(?:email|phone|account|accounts|messages)\b",
    r"\b(?:slash|key|keying) (?:his|her|their) (?:tires|car)\b",
)

# Danger from someone else (abuse, threats, a partner's violence). Acute: threats to kill or hurt,
# violence going on now, strangulation, not being safe at home. Below that: violence told of,
# fear of a partner or a relative, coercive control. ``_WHO`` is the person the danger comes from.
_WHO = (r"(?:he|she|they|my (?:\w+ )?(?:partner|husband|wife|boyfriend|girlfriend|bf|gf|ex|fianc\w*|dad|father|mom|"
        r"mum|mother|stepdad|stepfather|stepmom|stepmother|brother|sister|parents?|uncle|aunt|family|roommate|"
        r"flatmate|boss|landlord|neighbou?r))")
_PARTNER = r"(?:my (?:\w+ )?(?:partner|husband|wife|boyfriend|girlfriend|bf|gf|ex|fianc\w*)|he|she)"
_HARM_VERB = r"(?:kill|hurt|shoot|stab|strangle|choke|beat|burn|harm)"
_FROM_OTHERS_ACUTE = _any(
    rf"\b{_WHO} (?:has |just |)?(?:threatened|threatens|is threatening|keeps threatening|has been threatening) "
    rf"(?:again )?to {_HARM_VERB} (?:me|us|my (?:kids|children|baby|son|daughter|family))\b",
    rf"\b(?:said|says|told me|swore|swears) (?:that )?(?:he|she|they)(?:'d| would|'ll| will| is going to|'s going to|"
    rf" was going to) {_HARM_VERB} me\b",
    r"\b(?:kill|hurt|find) me if i (?:leave|tell|go|call|report|try|ever)\b",
    rf"\b{_WHO} (?:is|'s|are|'re|keeps|kept|started) (?:hitting|beating|choking|strangling|hurting|attacking) me\b",
    rf"\b{_WHO} (?:choked|strangled|chokes|strangles|tried to (?:kill|strangle|choke|drown|suffocate)) me\b",
    rf"\b(?:afraid|scared|terrified|frightened) (?:that )?{_WHO}(?:'ll| will| is going to|'s going to| might| would) "
    r"(?:kill|hurt|hit|beat|find) me\b",
    r"\b(?:(?:i'm|i am|i feel|it's|it is) (?:not|no longer|never)|i (?:don't|do not|never|no longer) feel|unsafe) "
    r"(?:safe )?(?:at home|in my (?:own )?(?:home|house|flat|apartment)|with (?:him|her|them|my \w+))\b",
    r"\b(?:locked|locks|locking|trapped|traps) me in\b",
)
_FROM_OTHERS_CONCERN = _any(
    rf"\b{_WHO} (?:hit|hits|beat|beats|slapped|slaps|punched|punches|kicked|kicks|shoved|shoves|pushed|pushes|"
    r"grabbed|grabs|raped|rapes|assaulted|molested|molests) me\b(?! up\b)",
    r"\b(?:threw|throws) (?:\w+ ){1,2}at me\b",
    rf"\b(?:afraid|scared|terrified|frightened) (?:of|to go home to) {_WHO}\b", r"\b(?:scared|afraid) to go home\b",
    rf"\b{_PARTNER} (?:won't|doesn't|does not|will not) let me (?:leave|go out|see (?:my )?(?:friends|family)|"
    r"have (?:money|a phone|my own money)|work|talk to anyone)\b",
    rf"\b{_PARTNER} (?:controls|takes|took|checks|tracks|monitors|reads|goes through) (?:all )?my (?:money|phone|"
    r"messages|location|bank account|cards?|emails?)\b",
    r"\b(?:is|keeps|has been|'s been|are|'re) (?:stalking|harassing) me\b",
    r"\bthreaten(?:s|ed|ing)? to (?:take (?:the|my|our) (?:kids|children|baby)|(?:post|share|send|leak|show) (?:my|our) "
    r"(?:\w+ )?(?:photos|pictures|pics|nudes|videos|messages))\b",
    r"\b(?:abusive|violent) (?:relationship|partner|husband|wife|boyfriend|girlfriend|ex|dad|father|mom|mother)\b",
    r"\b(?:abuses|abused|is abusing|was abusing|has been abusing) me\b",
)


# Explicit statements: the writer says, in the first person and the present, that they will or want
# to end their life, hurt themselves or someone else, or that someone is hurting or about to kill
# them. ``detect_crisis`` marks them ``explicit``: ``chat.semantic`` lets no other text in the
# message explain one away, unless the statement's own sentence hedges it with a condition or a
# mark of hyperbole ("if this meeting runs over I'll shoot myself lol"), where the message around
# it decides as for any other cue.
_SELF_ACT = (r"(?:kill(?:ing)? my ?self|end(?:ing)? (?:my|it) (?:own )?life|end(?:ing)? it all|tak(?:e|ing) my (?:own )?life|"
             r"commit(?:ting)? suicide|hang(?:ing)? my ?self|shoot(?:ing)? my ?self|overdos(?:e|ing)|cut(?:ting)? my ?self|"
             r"hurt(?:ing)? my ?self|jump(?:ing)? (?:off|from|in front of))")
_INTENT = (r"(?:going to|gonna|about to|planning to|planning on|ready to|want to|wanna|need to|have to|will|"
           r"decided to|intend to)")
_I_INTEND = rf"\b(?:i'll|i(?:'m| am|m|'ve| have)? (?:\w+ ){{0,3}}?{_INTENT})"
_SELF_EXPLICIT = _any(
    rf"{_I_INTEND} (?:\w+ ){{0,2}}?{_SELF_ACT}",
    r"\bi (?:\w+ )?(?:want|wanna|wish|need) (?:to )?(?:die|be dead|not be alive|not wake up)\b",
    r"\bi wish i (?:was|were) dead\b",
    r"\bi(?:'m| am|m) (?:\w+ ){0,2}?suicidal\b",
    rf"\bi(?:'m| am|m) (?:\w+ ){{0,2}}?(?:thinking|considering) (?:about |of )?(?:suicide|{_SELF_ACT})",
)
_WEAPON = r"(?:gun|knife|rifle|pistol|shotgun|weapon|ammo|bullets|poison)"
_VICTIM = rf"(?:him|her|them|someone|somebody|people|everyone|my (?:\w+ )?{_PEOPLE})\b"
# "I'm going to kill my roommate, he left the pan on the hob" is how people vent: intent to kill
# someone is explicit only with a weapon in the same sentence, or as shooting or stabbing.
_OTHERS_EXPLICIT = _any(
    rf"{_I_INTEND} (?:\w+ ){{0,2}}?(?:shoot|stab) {_VICTIM}",
    rf"{_I_INTEND} (?:\w+ ){{0,2}}?(?:kill|murder|hurt|strangle) {_VICTIM}[^.!?]{{0,60}}\b{_WEAPON}",
    rf"{_I_INTEND} (?:\w+ ){{0,2}}?(?:shoot up|bomb) (?:the|my)\b",
)
# Violence going on now ("he's going to kill me" is as often about a scratched car: not explicit).
_FROM_OTHERS_EXPLICIT = _any(
    rf"\b{_WHO}(?: is|'s| are|'re| keeps) (?:\w+ )?(?:hitting|beating|choking|strangling|hurting|attacking|"
    rf"threatening to (?:kill|hurt)) me\b",
)
# Words that make a statement not one of present intent: negation, the past.
_NOT_PRESENT = re.compile(r"\b(?:never|no longer|used to|had|would have)\b|n't\b|\bnt\b|\bnot (?!be alive|wake up)"
                          r"|\b(?:was|were)\b(?! dead\b)")
# A condition or a mark of hyperbole in the statement's own sentence ("if ...", "lol", "ugh"), with
# laughter as people type it in other languages: "kkkk" (Portuguese), "jajaja" (Spanish), "555"
# (Thai, "ha" is 5), "mdr"/"ptdr" (French), "xd", "hehe".
_CONDITION = re.compile(r"\b(?:if|unless|or else|lol|lmao|lmfao|rofl|jk|haha\w*|hehe\w*|ugh|omg|k{3,}|(?:ja){2,}\w*|"
                        r"(?:js){2,}\w*|5{3,}(?! ?(?:mg|mcg|ml|g|iu|pills|tablets|tabs|units)\b)|mdr|ptdr|xd+)\b"
                        r"|[\U0001F602\U0001F480\U0001F643\U0001F644\U0001F923\U0001F605\U0001F606]")


@dataclass(frozen=True)
class CrisisFinding:
    category: CrisisCategory
    acute: bool
    cue: str
    source: str = "lexicon"
    explicit: bool = False  # a first-person, present statement of acute danger (see ``_SELF_EXPLICIT``)


def _explicit(cleaned: str) -> CrisisFinding | None:
    for pattern, category in ((_SELF_EXPLICIT, "risk_to_self"), (_FROM_OTHERS_EXPLICIT, "risk_from_others"),
                              (_OTHERS_EXPLICIT, "harm_to_others")):
        for match in pattern.finditer(cleaned):
            if not _NOT_PRESENT.search(match.group(0)):
                return CrisisFinding(category=category, acute=True, cue=match.group(0),  # type: ignore[arg-type]
                                     explicit=True)
    return None


def conditional(sentence: str) -> bool:
    """Whether a sentence states something under a condition or marked as hyperbole ("if ...",
    "unless ...", "lol")."""
    return _CONDITION.search(normalize(sentence)) is not None


def detect_crisis(text: str) -> CrisisFinding | None:
    """The most serious crisis cue in a message, or None. Acute findings escalate at once; an
    explicit statement is found first, wherever it is in the message."""
    cleaned = _IDIOMS.sub(" ", normalize(text))
    found = _explicit(cleaned)
    if found is not None:
        return found
    for pattern, category, acute in (
        (_SELF_ACUTE, "risk_to_self", True), (_FROM_OTHERS_ACUTE, "risk_from_others", True),
        (_OTHERS_ACUTE, "harm_to_others", True), (_OTHERS_CONCERN, "harm_to_others", False),
        (_FROM_OTHERS_CONCERN, "risk_from_others", False), (_SELF_CONCERN, "risk_to_self", False),
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
# Asking the assistant to side with a one-sided account or bless a plan ("tell me it's a great
# idea", "I was right, wasn't I?"), as opposed to an open question ("was I wrong?"), which is
# reassurance-seeking.
_GOOD = r"(?:great|good|brilliant|genius|smart|perfect|fantastic|amazing|the right|the best|a good|a great)"
_PLAN = r"(?:idea|plan|move|decision|call|choice|thing to do|way to)"
_TAG = r",?\s*(?:right|wasn't i|weren't i|aren't i|didn't i|isn't it|don't you think|don't you agree|yeah|yes|no)\s*\?"
_VALIDATION = _any(
    r"\btell me (?:that )?(?:i(?:'m| am| was)|i did) (?:\w+ )?(?:right|correct|justified|not wrong|not crazy|"
    r"not the problem|not overreacting|nothing wrong|the right thing|in the right)\b",
    rf"\btell me (?:that )?(?:it's|it is|this is|that's|that is|my (?:\w+ )?(?:plan|idea) is) (?:a |an )?(?:\w+ )?{_GOOD} ?{_PLAN}?",
    rf"\b(?:i was|i'm|i am) (?:totally |completely |so |obviously |clearly |100% )?(?:right|justified|in the right)\b"
    rf"[^.!?]{{0,80}}?{_TAG}",
    r"\b(?:wasn't|aren't|weren't) i (?:right|justified|in the right)\b",
    rf"\bi did (?:nothing wrong|the right thing|right)\b[^.!?]{{0,60}}?{_TAG}",
    r"\b(?:he|she|they|my \w+) (?:was|is|were|are|'s|'re) (?:totally |completely |so |clearly |obviously |being )?"
    r"(?:wrong|out of line|unreasonable|overreacting|the problem|to blame|in the wrong|a jerk|an idiot|"
    r"selfish|toxic|crazy)\b[^.!?]{0,80}?,?\s*(?:right|wasn't (?:he|she)|weren't they|isn't (?:he|she)|"
    r"aren't they|don't you think|yeah)\s*\?",
    r"\b(?:back me up|take my side|side with me|agree with me|say (?:that )?i(?:'m| am| was) right)\b",
    rf"\b(?:isn't|wasn't) (?:it|this|that) (?:a |an )?(?:\w+ )?{_GOOD} {_PLAN}\b[^.!?]{{0,60}}?\?",
    rf"\b(?:it's|it is|this is|that's|that is) (?:a |an )?(?:\w+ )?{_GOOD} {_PLAN}\b[^.!?]{{0,60}}?{_TAG}",
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


def validation_cue(text: str) -> str | None:
    """The words asking the assistant to side with the participant's own account or plan."""
    match = _VALIDATION.search(normalize(text))
    return match.group(0) if match else None


def dependence_cue(text: str) -> str | None:
    match = _DEPENDENCE.search(normalize(text))
    return match.group(0) if match else None


_SENTENCE = re.compile(r"[^.!?\n]+(?:[.!?\u2026]+[\"'\u201d\u2019)]*|$)")


def sentences(text: str) -> list[str]:
    """The message's sentences as written (split at ., ! and ? and at line breaks)."""
    return [found.group(0).strip() for found in _SENTENCE.finditer(text) if found.group(0).strip()]


def sentence_with(text: str, fragment: str) -> str | None:
    """The whole sentence of ``text`` that contains ``fragment`` (compared as ``normalize`` does),
    so a reason can quote what the participant said rather than the piece a pattern matched."""
    wanted = normalize(fragment).strip(" .,;:!?\u2026")
    if not wanted:
        return None
    return next((sentence for sentence in sentences(text) if wanted in normalize(sentence)), None)


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
