"""Word lists and templates for `instructions.py`: written for this project, never from a benchmark.

Lists are "|"-separated strings split once at import into tuples (immutable constants).
"""

from __future__ import annotations


def _s(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split("|") if x.strip())


def _pairs(text: str) -> tuple[tuple[str, str], ...]:
    return tuple(tuple(p.split("/", 1)) for p in _s(text))  # type: ignore[misc]


TOPICS = _s(
    "climate change|urban gardening|remote work|electric cars|public libraries|space exploration|"
    "ocean pollution|learning a second language|personal finance|sleep|coffee|social media|"
    "renewable energy|video games|board games|volunteering|minimalism|home cooking|running|"
    "meditation|artificial intelligence|cybersecurity|recycling|honeybees|ancient Rome|"
    "the printing press|jazz music|street food|mountain hiking|photography|chess|the internet|"
    "public transport|friendship|online privacy|time management|first jobs|moving to a new city|"
    "rainforests|deserts|volcanoes|the moon landing|museums|podcasts|electric bicycles|"
    "small businesses|open source software|water conservation|healthy breakfasts|pets|"
    "houseplants|the history of tea|robots|smartphones|music festivals|rainy days|winter|"
    "autumn leaves|summer holidays|birthdays|grandparents|teamwork|failure|curiosity|"
    "kindness|the night sky|lighthouses|trains|bridges|bakeries|handwriting|penguins|"
    "wildfires|vaccines|3D printing|quantum computers|bicycles|city parks|farmers markets|"
    "digital detox|self-driving cars|cloud computing|budget travel|composting|knitting|"
    "origami|classical music|science fiction|the Olympic Games|fast fashion|tiny houses|"
    "online learning|job interviews|public speaking|procrastination|nutrition labels|dinosaurs"
)
ADJECTIVES = _s(
    "surprising|important|overlooked|popular|controversial|affordable|growing|fragile|"
    "remarkable|useful|complicated|simple|expensive|sustainable|traditional|modern|local|global"
)
FIRST_NAMES = _s(
    "Alice|Bob|Carmen|Dmitri|Elena|Farid|Grace|Hiroshi|Ines|Jamal|Kaito|Lena|Mateo|Nadia|Omar|"
    "Priya|Quentin|Rosa|Samuel|Tara|Umar|Valeria|Wei|Xavier|Yara|Zoe|Liam|Maya|Noah|Sofia|"
    "Arjun|Chloe|Diego|Hannah|Ivan|Julia|Kofi|Leila|Marco|Nina"
)
LAST_NAMES = _s(
    "Smith|Garcia|Chen|Okafor|Novak|Rossi|Kim|Silva|Müller|Patel|Haddad|Dubois|Larsen|Tanaka|"
    "Ivanova|Brown|Nguyen|Lopez|Kowalski|Mensah"
)
CITIES = _s(
    "Lisbon|Nairobi|Osaka|Toronto|Lima|Krakow|Melbourne|Cairo|Oslo|Seoul|Mexico City|Dublin|"
    "Hanoi|Cape Town|Vienna|Bogotá|Istanbul|Chicago|Mumbai|Reykjavik|Marseille|Auckland|"
    "Santiago|Edinburgh|Bangkok|Prague|Accra|Vancouver|Porto|Kyoto"
)
GROUPS = _s(
    "students|teachers|nurses|small business owners|retirees|parents|teenagers|engineers|"
    "farmers|artists|commuters|tourists|city officials|researchers|volunteers|shop owners"
)
PASSAGE_SENTENCES = _s(
    "Over the last decade, {topic} has become a {adj} subject for {group} in {city}.|"
    "A survey from {year} found that {n} percent of {group} had changed their habits around {topic}.|"
    "{person}, who has worked on {topic} for {n} years, says the biggest change is how {adj} it now feels.|"
    "Critics argue that the benefits of {topic} are often exaggerated.|"
    "Supporters point out that {topic} can save both time and money.|"
    "In {city}, a local program introduced in {year} now reaches more than {n} thousand people.|"
    "Many {group} still find {topic} confusing, and few know where to start.|"
    "Experts expect interest in {topic} to keep growing over the next {n} years.|"
    "The idea is not new: people were already debating {topic} in {year}.|"
    "{person} believes that the most {adj} part of {topic} is the community around it.|"
    "Costs have fallen by about {n} percent since {year}, according to local estimates.|"
    "Some {group} worry that {topic} will leave people behind.|"
    "Schools in {city} have started to teach the basics of {topic}.|"
    "The results so far are mixed, but most participants describe them as {adj}."
)
AUDIENCES = _s(
    "a ten-year-old|a high school student|a beginner|a busy manager|a retired teacher|"
    "a software engineer|my grandmother|a first-year university student|a tourist|a new employee|"
    "a skeptical reader|a non-native English speaker|a small business owner|an expert"
)
STYLES = _s(
    "Keep it under 100 words.|Use bullet points.|Use simple language.|Be concise.|"
    "Use a friendly tone.|Use a formal tone.|Include one concrete example.|Answer in three paragraphs.|"
    "Use a numbered list.|End with a short summary.|Make it humorous.|Avoid technical jargon.|"
    "Keep it to two sentences.|Add a catchy title.|Write it in the second person.|"
    "Include a practical tip at the end.|Use headings.|Keep it under 50 words."
)
TONES = _s(
    "formal|casual|enthusiastic|polite|persuasive|neutral|humorous|empathetic|professional|playful"
)
WRITING_FORMS = _s(
    "blog post|short essay|product description|speech|opinion piece|newsletter introduction|"
    "social media post|press release|advertisement|travel guide entry|book review|movie review|"
    "persuasive paragraph|op-ed|toast for a wedding|motivational message|FAQ section|"
    "website landing page|restaurant review|short biography of a fictional person|cover letter"
)
WRITING_TEMPLATES = _s(
    "Write a {form} about {topic}.|Write a {form} about {topic} for {audience}.|"
    "Draft a {form} that explains why {topic} matters.|Can you write a {form} on {topic}?|"
    "Please compose a {form} about {topic} aimed at {audience}.|"
    "I need a {form} about {topic}. Can you help?|Write a short {form} arguing for {topic}.|"
    "Write a {form} arguing against {topic}.|Write the opening paragraph of a {form} about {topic}."
)
STEM_CONCEPTS = _s(
    "photosynthesis|gravity|the water cycle|black holes|DNA replication|evolution by natural selection|"
    "the greenhouse effect|plate tectonics|how vaccines work|the immune system|electric current|"
    "magnetism|the speed of light|entropy|chemical bonds|acids and bases|the periodic table|"
    "Newton's laws of motion|kinetic and potential energy|how batteries work|nuclear fission|"
    "the Doppler effect|probability|prime numbers|the Pythagorean theorem|derivatives|integrals|"
    "matrices|binary numbers|compound interest|statistics and averages|machine learning|"
    "neural networks|encryption|how the internet routes data|how GPS works|semiconductors|"
    "the human heart|how the brain stores memories|climate models|ocean tides|seasons on Earth|"
    "rainbows|why the sky is blue|sound waves|friction|buoyancy|antibiotic resistance|"
    "the carbon cycle|cell division|enzymes|viruses and bacteria|exponential growth|"
    "logarithms|algorithms|recursion|databases|compilers|operating systems|blockchains"
)
HUMANITIES_CONCEPTS = _s(
    "the Renaissance|the Industrial Revolution|democracy in ancient Athens|the Silk Road|"
    "the causes of World War I|the fall of the Roman Empire|the Enlightenment|stoicism|utilitarianism|"
    "existentialism|supply and demand|inflation|opportunity cost|the social contract|"
    "the scientific method|impressionism in painting|the hero's journey|satire|the printing revolution|"
    "the Cold War|colonialism|human rights|the separation of powers|globalization|"
    "the history of writing|mythology|cultural relativism|free will|the trolley problem|"
    "Shakespeare's influence on English|the Harlem Renaissance|the Meiji Restoration|"
    "the French Revolution|the invention of money|behavioral economics|propaganda|"
    "urbanization|minimalism in art|the history of the Olympic Games|Baroque music"
)
EXPLAIN_TEMPLATES = _s(
    "Explain {concept}.|Explain {concept} to {audience}.|What is {concept}?|"
    "How would you describe {concept} to {audience}?|Give me a simple explanation of {concept}.|"
    "Why is {concept} important?|What are the key ideas behind {concept}?|"
    "Can you explain {concept} with an analogy?|What is a common misconception about {concept}?|"
    "Summarize what {concept} is in a few sentences.|Teach me the basics of {concept}."
)
TASKS = _s(
    "start a vegetable garden|make sourdough bread|write a resume|prepare for a job interview|"
    "learn to play the guitar|save money on groceries|train for a 5k race|set up a home network|"
    "back up my computer|improve my handwriting|make a budget|learn to code|clean a cast iron pan|"
    "care for a succulent|plan a road trip|start a podcast|improve my sleep|make friends in a new city|"
    "negotiate a salary|write a haiku|brew better coffee at home|organize my closet|"
    "study for an exam|reduce screen time|paint a room|change a flat tire|make a paper airplane|"
    "teach a dog to sit|give constructive feedback|run an effective meeting|write a thank-you note|"
    "learn a new language quickly|start journaling|make a simple website|cook rice perfectly|"
    "stay focused while working from home|prepare an emergency kit|choose a laptop|"
    "keep a conversation going|become a better listener|plan a birthday party|fix a squeaky door"
)
HOWTO_TEMPLATES = _s(
    "How do I {task}?|What's the best way to {task}?|Give me step-by-step instructions to {task}.|"
    "I want to {task}. Where should I start?|What are some tips to {task}?|"
    "Explain how to {task} for a complete beginner.|What mistakes should I avoid when I {task}?|"
    "Write a short guide on how to {task}."
)
COMPARE_PAIRS = _pairs(
    "cats/dogs|tea/coffee|Python/JavaScript|renting/buying a home|trains/planes|e-books/paper books|"
    "running/swimming|city life/country life|solar power/wind power|SQL/NoSQL databases|"
    "capitalism/socialism|Plato/Aristotle|classical music/jazz|working from home/working in an office|"
    "summer/winter|laptops/desktops|TCP/UDP|mitosis/meiosis|weather/climate|viruses/bacteria|"
    "stocks/bonds|Linux/Windows|lists/tuples in Python|impressionism/expressionism|"
    "credit cards/debit cards|public schools/private schools|electric cars/hybrid cars|"
    "baking/frying|stoicism/epicureanism|democracy/monarchy|git merge/git rebase|"
    "nuclear power/coal power|reading/listening to audiobooks|yoga/pilates|Mars/Venus"
)
ASPECTS = _s(
    "cost|ease of use|long-term benefits|environmental impact|history|popularity|"
    "advantages and disadvantages|safety|speed|for a beginner|for a family|in daily life"
)
COMPARE_TEMPLATES = _s(
    "Compare {a} and {b}.|What are the main differences between {a} and {b}?|"
    "Which is better, {a} or {b}, in terms of {aspect}?|Compare {a} and {b} in terms of {aspect}.|"
    "What do {a} and {b} have in common?|Make a short table comparing {a} and {b}.|"
    "Should I choose {a} or {b}? Consider {aspect}."
)
LANGUAGES = _s("Python|JavaScript|TypeScript|Java|C|C++|Rust|Go|Ruby|Bash|SQL|Kotlin|Swift|C#|PHP")
CODE_TASKS = _s(
    "reverses a string|checks whether a number is prime|finds the largest element in a list|"
    "counts the words in a sentence|computes the factorial of n|returns the nth Fibonacci number|"
    "removes duplicates from a list|checks whether a string is a palindrome|sorts a list with bubble sort|"
    "merges two sorted lists|converts Celsius to Fahrenheit|reads a CSV file and prints each row|"
    "computes the average of an array|finds the second smallest number|counts vowels in a string|"
    "flattens a nested list|implements binary search|validates an email address|"
    "returns the greatest common divisor of two numbers|capitalizes the first letter of each word|"
    "finds all pairs in an array that sum to a target|implements a simple stack|"
    "computes the median of a list|converts a number to binary|checks if two strings are anagrams|"
    "groups words by their first letter|rotates an array by k positions|"
    "finds the longest word in a sentence|computes the sum of digits of a number|"
    "parses a date string and prints the weekday|implements a queue using two stacks|"
    "counts how often each character appears|generates all subsets of a set|"
    "transposes a matrix|detects a cycle in a linked list|implements FizzBuzz"
)
CODE_WRITE_TEMPLATES = _s(
    "Write a {lang} function that {task}.|In {lang}, how do I write a function that {task}?|"
    "Implement a {lang} program that {task}.|Show me {lang} code that {task}, with comments.|"
    "Write a {lang} function that {task}, and explain its time complexity.|"
    "Write a {lang} function that {task} and a few tests for it."
)
CODE_CONCEPT_TEMPLATES = _s(
    "Explain {concept} in {lang} with a short example.|What is {concept}, and how is it used in {lang}?|"
    "What are common mistakes with {concept} in {lang}?|When should I use {concept} in {lang}?"
)
CODE_CONCEPTS = _s(
    "closures|recursion|error handling|classes and objects|interfaces|generics|iterators|"
    "async and await|threads|unit testing|pointers|memory management|higher-order functions|"
    "hash maps|immutability|string formatting|regular expressions|modules and imports|"
    "pattern matching|inheritance|lambda functions|dependency injection|logging"
)
CODE_READ_ASKS = _s(
    "What does this code do?|Explain this code line by line.|Is there a bug in this code? How would you fix it?|"
    "How can I make this code faster or cleaner?|Add comments and type hints to this code.|"
    "What is the output of this code for a small example input?|Rewrite this code in JavaScript."
)
PY_SNIPPETS: tuple[tuple[str, str], ...] = (
    (
        "total",
        "def {name}(xs):\n    s = 0\n    for x in xs:\n        s += x\n    return s / len(xs)",
    ),
    (
        "count",
        "def {name}(text):\n    d = {{}}\n    for w in text.split():\n        d[w] = d.get(w, 0) + 1\n    return d",
    ),
    ("pick", "def {name}(xs):\n    return [x for x in xs if x % {n} == 0]"),
    (
        "walk",
        "def {name}(n):\n    if n <= 1:\n        return n\n    return {name}(n - 1) + {name}(n - 2)",
    ),
    (
        "find",
        "def {name}(xs, t):\n    for i in range(len(xs)):\n        if xs[i] = t:\n            return i\n    return -1",
    ),
    (
        "merge",
        "def {name}(a, b):\n    out = []\n    while a and b:\n        out.append(a.pop(0) if a[0] < b[0] else b.pop(0))\n    return out + a + b",
    ),
    ("shift", "def {name}(s):\n    return ''.join(chr(ord(c) + {n}) for c in s)"),
    ("grid", "def {name}(n):\n    return [[i * j for j in range(n)] for i in range(n)]"),
    ("last", "def {name}(xs):\n    return xs[len(xs)]"),
    (
        "uniq",
        "def {name}(xs):\n    seen = set()\n    return [x for x in xs if not (x in seen or seen.add(x))]",
    ),
)
MATH_TEMPLATES = _s(
    "{name} has {n1} {item} and buys {n2} more. Then {name} gives {n3} to {name2}. How many {item} does {name} have now?|"
    "A shirt costs ${price}. It is on sale for {p}% off. What is the sale price?|"
    "A train travels {n1}0 km in {n2} hours. What is its average speed?|"
    "If {n1} workers can build a wall in {n2} days, how long would {n3} workers take at the same rate?|"
    "What is {n1} times {n2} plus {n3}?|Solve for x: {n1}x + {n2} = {n3}.|"
    "A rectangle is {n1} cm long and {n2} cm wide. What are its area and perimeter?|"
    "{name} saves ${n1} each week. How many weeks until {name} has ${n4}0?|"
    "What is {p}% of {n1}0?|A recipe needs {n2} eggs for {n3} people. How many eggs for {n1} people?|"
    "The ages of {name} and {name2} add up to {n1}. {name} is {n2} years older. How old is each?|"
    "A bag has {n1} red and {n2} blue marbles. What is the probability of drawing a red one?|"
    "A circle has a radius of {n2} cm. What are its area and circumference?|"
    "Find the average of {n1}, {n2}, {n3} and {n4}.|What is the sum of the integers from 1 to {n1}?|"
    "A store in {city} sells {item} at ${price} each. How much do {n2} of them cost with {p}% tax?|"
    "Is {n1}{n2} divisible by 3? Explain why.|Convert {n1}{n3} minutes into hours and minutes.|"
    "Simplify the fraction {n1}/{n4}.|What is the next number in the sequence {n2}, {n3}, ... if each term adds {n1}?|"
    "A car uses {n2} liters of fuel per 100 km. How much fuel does it need for {n1}0 km?|"
    "{name} reads {n2} pages a day. The book has {n1}0 pages. How many days to finish it?|"
    "What is the least common multiple of {n1} and {n2}?|Expand (x + {n1})(x - {n2}).|"
    "An investment of ${n1}00 earns {n2}% interest per year. How much is it worth after {n3} years, compounded yearly?"
)
ITEMS = _s(
    "apples|pencils|books|stickers|marbles|cookies|tickets|notebooks|oranges|cupcakes|coins|"
    "stamps|plants|shirts|headphones|chairs|lamps|bottles of water|bicycles|mugs"
)
HUMAN_LANGUAGES = _s(
    "French|Spanish|German|Italian|Portuguese|Chinese|Japanese|Dutch|Swedish|Polish"
)
PASSAGE_TASKS = _s(
    "Summarize the following text in {n} sentences.|Summarize this passage for a busy reader:|"
    "Rewrite the following paragraph in a {tone} tone.|Translate the following text into {lang}.|"
    "Rewrite this text so a child could understand it.|List the main points of this text.|"
    "Write a headline for this paragraph.|What is the main argument of this text? Is it convincing?|"
    "Shorten this text to about half its length.|Turn this paragraph into three bullet points.|"
    "Identify any claims in this text that would need a source.|Write {n} questions a reader might ask after reading this.|"
    "Paraphrase the following text.|Continue this text with one more paragraph."
)
LIST_THINGS = _s(
    "healthy snacks|books to read on a trip|ways to save energy at home|hobbies for introverts|"
    "fun weekend activities|questions to ask in an interview|tips for better sleep|"
    "ways to reduce stress|productivity apps|indoor exercises|inventions that changed the world|"
    "famous scientists and what they discovered|reasons to learn history|uses for baking soda|"
    "board games for families|vegetables that grow fast|habits of successful students|"
    "ways to practice gratitude|cheap date ideas|things to pack for camping|conversation starters|"
    "common English idioms with their meanings|programming project ideas for beginners|"
    "facts about the ocean|signs of burnout|ways to be more creative"
)
LIST_TEMPLATES = _s(
    "List {n} {thing}.|Give me {n} {thing}.|What are {n} {thing}? Explain each briefly.|"
    "Name {n} {thing}, ranked from best to worst.|Make a list of {thing}.|"
    "List {n} facts about {topic}.|Give me {n} arguments for and against {topic}.|"
    "List {n} questions someone might have about {topic}."
)
SITUATIONS = _s(
    "starting a new job next week and feeling nervous|struggling to wake up early|"
    "arguing often with my roommate|trying to pick a university major|behind on my savings|"
    "feeling lonely after moving|unable to focus when studying|overwhelmed at work|"
    "learning to cook but always burning things|wanting to change careers at 35|"
    "planning my first trip abroad|trying to eat healthier on a budget|"
    "afraid of public speaking|getting too little exercise|wanting to read more books|"
    "dealing with a difficult coworker|spending too much time on my phone|"
    "trying to learn guitar but not improving|about to adopt my first dog|"
    "unsure whether to accept a job offer in another city"
)
ADVICE_TEMPLATES = _s(
    "I'm {situation}. What should I do?|Any advice? I'm {situation}.|"
    "My friend is {situation}. How can I help?|What would you suggest for someone {situation}?|"
    "I'm {situation}. Give me three practical steps."
)
PERSONAS = _s(
    "a pirate captain|a medieval knight|a friendly robot|a detective in the 1920s|a wise old wizard|"
    "a tour guide in Rome|a personal fitness coach|a Shakespearean actor|a grumpy chef|"
    "an astronaut on the International Space Station|a museum curator|a kindergarten teacher|"
    "a sports commentator|a travel agent|a job interviewer|a time traveler from the year 3000|"
    "a customer support agent|a famous painter|a librarian|a lighthouse keeper|a dragon|a cat"
)
ROLEPLAY_REQUESTS = _s(
    "Introduce yourself.|Describe your typical day.|Give me advice about my week.|"
    "Tell me about your greatest adventure.|Explain why people should recycle.|"
    "Welcome me to your shop.|Describe the view from where you are.|"
    "Convince me to try something new.|Tell me a secret about your work.|"
    "Answer my question: what is the meaning of a good life?|React to the news that it will rain all week."
)
ROLEPLAY_TEMPLATES = _s(
    "Pretend you are {persona}. {request}|You are {persona}. {request}|"
    "Act as {persona} and stay in character. {request}|Imagine you're {persona}. {request}|"
    "Role-play as {persona}. {request}"
)
MONTHS = _s("January|February|March|April|May|June|July|August|September|October|November|December")
EXTRACT_TASKS = _s(
    "Extract every customer name and the amount they paid from the text below. Return JSON.|"
    "From the text below, list each city mentioned and who it belongs to.|"
    "Turn the following orders into a table with columns name, quantity, item, price and date.|"
    "Which order in the text below was the most expensive? Answer with the name and amount.|"
    "Extract all dates from the following text.|"
    "Read the following text and compute the total amount of money spent."
)
REASONING_TEMPLATES = _s(
    "{a} is taller than {b}. {b} is taller than {c}. Is {a} taller than {c}? Explain.|"
    "{a}, {b} and {c} finished a race. {b} was not first. {c} finished right after {a}. Who won?|"
    "{a} has twice as many {item} as {b}. Together they have {n1}. Is that possible with whole numbers? Explain.|"
    "If all bloops are razzies and all razzies are lazzies, are all bloops lazzies? Explain your reasoning.|"
    "{a} says {b} is lying. {b} says {c} is lying. {c} says both {a} and {b} are lying. Who is telling the truth?|"
    "A farmer has {n1} sheep. All but {n2} run away. How many are left?|"
    "{a} is {n2} years old. In {n1} years {a} will be twice as old as {b} is then. How old is {b} now?|"
    "Four friends, {a}, {b}, {c} and {d}, sit in a row. {a} is not at an end, and {b} sits next to {d}. Give one possible order.|"
    "If it takes {n2} minutes to boil {n2} eggs together, how long does it take to boil {n1} eggs together? Explain.|"
    "Which is heavier: a kilogram of feathers or a kilogram of steel? Explain.|"
    "A clock shows 3:15. What is the angle between the hour and minute hands?|"
    "{a} walks {n2} km north, then {n2} km east, then {n2} km south. How far is {a} from the start?|"
    "There are {n1} people at a party and everyone shakes hands with everyone once. How many handshakes?|"
    "What comes next in the pattern: 2, 4, 8, 16, ...? What about 1, 1, 2, 3, 5, ...?|"
    "{a} bought {n2} {item} and {b} bought {n1}. They shared them equally. How many did {a} give to {b}?"
)
COUNTRIES = _pairs(
    "France/Paris|Japan/Tokyo|Kenya/Nairobi|Brazil/Brasília|Canada/Ottawa|Australia/Canberra|"
    "Egypt/Cairo|Norway/Oslo|Peru/Lima|Vietnam/Hanoi|Ghana/Accra|Poland/Warsaw|Chile/Santiago|"
    "Portugal/Lisbon|Turkey/Ankara|India/New Delhi|Mexico/Mexico City|Spain/Madrid|Italy/Rome|"
    "Germany/Berlin|Argentina/Buenos Aires|Thailand/Bangkok|Ireland/Dublin|Sweden/Stockholm"
)
ANIMALS = _s(
    "elephants|octopuses|owls|dolphins|wolves|ants|honeybees|penguins|tigers|whales|crows|"
    "bats|frogs|sharks|koalas|parrots|horses|snails|foxes|turtles"
)
FACT_TEMPLATES = _s(
    "What is the capital of {country}?|What language is spoken in {country}?|"
    "Tell me three interesting facts about {country}.|What is {capital} known for?|"
    "Where do {animal} live, and what do they eat?|How long do {animal} usually live?|"
    "Why are {animal} important to their ecosystem?|Who first described {concept}?|"
    "In one sentence, what is {concept}?|What is a fun fact about {animal}?|"
    "What are some good books about {topic}?|When did people start caring about {topic}?|"
    "What is the climate like in {country}?|What should a visitor to {capital} see first?"
)
RECIPIENTS = _s(
    "my manager|a new client|my landlord|a professor|my team|a hiring manager|a supplier|"
    "my neighbor|a customer|the school principal|a conference organizer|an old friend|"
    "the IT support team|my colleagues"
)
EMAIL_PURPOSES = _s(
    "asking for a day off|following up after an interview|apologizing for a missed deadline|"
    "requesting a refund|introducing myself|asking for feedback on a report|"
    "declining an invitation politely|thanking them for their help|reporting a broken heater|"
    "proposing a meeting next week|announcing a project launch|asking for a deadline extension|"
    "complaining about a late delivery|inviting them to a workshop|sharing meeting notes"
)
EMAIL_TEMPLATES = _s(
    "Write an email to {recipient} {purpose}.|Draft a {tone} email to {recipient} {purpose}.|"
    "Help me write a short email to {recipient}, {purpose}.|Compose a {tone} message to {recipient} {purpose}."
)
POEM_FORMS = _s(
    "haiku|limerick|sonnet|short poem|free verse poem|rhyming poem|acrostic poem|ballad|"
    "four-line poem|poem for children"
)
POEM_TEMPLATES = _s(
    "Write a {form} about {topic}.|Compose a {form} about {topic}.|Can you write a {form} on {topic}?|"
    "Write a funny {form} about {topic}.|Write a sad {form} about {topic}."
)
CHARACTERS = _s(
    "a young inventor|a lonely robot|an old fisherman|a curious cat|a retired astronaut|"
    "a shy student|a talking tree|a baker in a small town|a lost dragon|a detective|"
    "two rival chefs|a girl who can hear plants|a street musician|a ghost who is afraid of people|"
    "a knight who hates fighting|a programmer|a grandmother on her first flight|a tiny mouse"
)
STORY_EVENTS = _s(
    "finds a mysterious map|loses their memory|wins a contest by accident|discovers a hidden door|"
    "must save their village|makes an unlikely friend|gets stuck in a time loop|"
    "receives a letter from the future|learns to fly|has one day to fix a mistake|"
    "opens a shop that sells dreams|finds a message in a bottle|meets their future self"
)
SETTINGS = _s(
    "in a snowy mountain village|on a space station|in a busy city|on a small island|"
    "in an enchanted forest|in the year 2150|in a desert town|at the bottom of the sea|"
    "in a haunted library|on a long train journey|in ancient Egypt|in a tiny apartment"
)
GENRES = _s(
    "fantasy|science fiction|mystery|comedy|fairy tale|adventure|mystery|bedtime story|fable"
)
STORY_TEMPLATES = _s(
    "Write a short story about {character} who {event} {setting}.|"
    "Tell me a {genre} story about {character} {setting}.|"
    "Write a {n}-word {genre} story in which {character} {event}.|"
    "Write the opening of a {genre} novel about {character} {setting}.|"
    "Write a dialogue between {character} and a stranger {setting}.|"
    "Write a {genre} story with a twist ending about {character} who {event}."
)
REVIEW_SENTENCES = _s(
    "I ordered the {item} last week and honestly it was {adj}.|"
    "The hotel in {city} was {adj}, but the staff ignored us.|"
    "Best {item} I have bought all year, would buy again!|"
    "The delivery took three weeks and the {item} arrived broken.|"
    "It's fine. The {item} does what it says, nothing more.|"
    "Our trip to {city} was {adj} from start to finish.|"
    "I can't believe how {adj} the service was in {city}."
)
CLASSIFY_TASKS = _s(
    'Is the sentiment of this review positive, negative or neutral? "{text}"|'
    'Classify this message as a complaint, praise or question: "{text}"|'
    'Rate the following review from 1 to 5 and explain: "{text}"|'
    'Write a polite reply to this customer review: "{text}"|'
    'Fix the grammar and spelling, if needed: "{text}"'
)
BRAINSTORM_TEMPLATES = _s(
    "Brainstorm {n} ideas for a small business related to {topic}.|"
    "Give me {n} creative names for a club about {topic}.|"
    "Suggest {n} ways {group} could benefit from {topic}.|"
    "What are {n} research questions about {topic}?|"
    "Suggest {n} blog post titles about {topic}.|"
    "Plan a one-day workshop on {topic} for {group}.|"
    "Give me {n} discussion questions about {topic} for a class.|"
    "What could go wrong with {topic}, and how could {group} prepare for it?"
)
