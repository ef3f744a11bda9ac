package estimator

import (
	"math/rand/v2"
	"strings"
)

// TextClass is one shape of text the tokenizer must count at a bounded cost;
// the benchmarks and the memory tests share them.
type TextClass struct{ Name, Text string }

// TextClasses returns the benchmark's input classes: prose, and the shapes
// that make long pre-tokenizer pieces or unusual scripts.
func TextClasses() []TextClass {
	return []TextClass{
		{"prose-2KB", strings.Repeat("The quick brown fox jumps over the lazy dog, and then it runs away. ", 30)},
		{"prose-64KB", prose(64 << 10)},
		{"one-word-1MB", strings.Repeat("a", 1<<20)},
		{"digits-1MB", digitText(1 << 20)},
		{"spaces-1MB", strings.Repeat(" ", 1<<20) + "x"},
		{"cjk-64KB", strings.Repeat("お誕生日おめでとう", 2427)},
		{"cjk-1MB", cjk(1 << 20)},
		{"emoji-64KB", repeatTo("😀🎉👍🏽🚀❤️", 64<<10)},
		{"mixed-64KB", repeatTo("Hello мир مرحبا 世界 ", 64<<10)},
		{"punct-64KB", repeatTo("!?.,;:-=+*&^%$#@~()[]{}<>", 64<<10)},
	}
}

func repeatTo(unit string, n int) string {
	return strings.Repeat(unit, max(1, n/len(unit)))
}

func digitText(n int) string {
	rng := rand.New(rand.NewPCG(7, 8))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('0' + rng.IntN(10))
	}
	return string(b)
}

// cjk is n bytes of varied Chinese and Japanese without spaces: one long
// pre-tokenizer piece made of many different characters.
func cjk(n int) string {
	const text = "人工智能正在改变世界的各个角落我们需要认真思考技术发展带来的机遇与挑战。" +
		"今日は天気がとても良いので公園へ散歩に行きましたそこで古い友人に会いました。" +
		"東京大学の研究者たちは新しい言語モデルを開発し多くの言語で高い性能を示した。"
	var sb strings.Builder
	rng := rand.New(rand.NewPCG(9, 10))
	runes := []rune(text)
	for sb.Len() < n {
		i := rng.IntN(len(runes) - 8)
		sb.WriteString(string(runes[i : i+1+rng.IntN(8)]))
	}
	return sb.String()
}

// prose is about n bytes of varied English: sentences of common words drawn
// with a skewed frequency, capitals, punctuation, contractions and numbers.
func prose(n int) string {
	words := strings.Fields(`the of and to a in is it you that he was for on are with as I his they
		be at one have this from or had by hot word but what some we can out other were all there when up
		use your how said an each she which do their time if will way about many then them write would like
		so these her long make thing see him two has look more day could go come did number sound no most
		people my over know water than call first who may down side been now find any new work part take
		get place made live where after back little only round man year came show every good me give our
		under name very through just form sentence great think say help low line differ turn cause much mean
		before move right boy old too same tell does set three want air well also play small end put home
		read hand port large spell add even land here must big high such follow act why ask men change went
		light kind off need house picture try us again animal point mother world near build self earth father
		head stand own page should country found answer school grow study still learn plant cover food sun
		four between state keep eye never last let thought city tree cross farm hard start might story saw
		far sea draw left late run don't while press close night real life few north open seem together next
		white children begin got walk example ease paper group always music those both mark often letter until
		mile river car feet care second book carry took science eat room friend began idea fish mountain stop
		once base hear horse cut sure watch color face wood main enough plain girl usual young ready above
		ever red list though feel talk bird soon body dog family direct pose leave song measure door product
		black short numeral class wind question happen complete ship area half rock order fire south problem
		piece told knew pass since top whole king space heard best hour better true during hundred five
		remember step early hold west ground interest reach fast verb sing listen six table travel less
		morning ten simple several vowel toward war lay against pattern slow center love person money serve
		appear road map rain rule govern pull cold notice voice unit power town fine certain fly fall lead
		cry dark machine note wait plan figure star box noun field rest correct able pound done beauty drive
		stood contain front teach week final gave green oh quick develop ocean warm free minute strong special
		mind behind clear tail produce fact street inch multiply nothing course stay wheel full force blue
		object decide surface deep moon island foot system busy test record boat common gold possible plane
		stead dry wonder laugh thousand ago ran check game shape equate miss brought heat snow tire bring yes
		distant fill east paint language among grand ball yet wave drop heart present heavy dance engine
		position arm wide sail material size vary settle speak weight general ice matter circle pair include
		divide syllable felt perhaps pick sudden count square reason length represent art subject region
		energy hunt probable bed brother egg ride cell believe fraction forest sit race window store summer
		train sleep prove lone leg exercise wall catch mount wish sky board joy winter sat written wild
		instrument kept glass grass cow job edge sign visit past soft fun bright gas weather month million
		bear finish happy hope flower clothe strange gone jump baby eight village meet root buy raise solve
		metal whether push seven paragraph third shall held hair describe cook floor either result burn hill
		safe cat century consider type law bit coast copy phrase silent tall sand soil roll temperature finger
		industry value fight lie beat excite natural view sense ear else quite broke case middle kill son lake
		moment scale loud spring observe child straight consonant nation dictionary milk speed method organ
		pay age section dress cloud surprise quiet stone tiny climb cool design poor lot experiment bottom key
		iron single stick flat twenty skin smile crease hole trade melody trip office receive row mouth exact
		symbol die least trouble shout except wrote seed tone join suggest clean break lady yard rise bad blow
		oil blood touch grew cent mix team wire cost lost brown wear garden equal sent choose fell fit flow
		fair bank collect save control decimal gentle woman captain practice separate difficult doctor please
		protect noon whose locate ring character insect caught period indicate radio spoke atom human history
		effect electric expect crop modern element hit student corner party supply bone rail imagine provide
		agree thus capital won't chair danger fruit rich thick soldier process operate guess necessary sharp
		wing create neighbor wash bat rather crowd corn compare poem string bell depend meat rub tube famous
		dollar stream fear sight thin triangle planet hurry chief colony clock mine tie enter major fresh
		search send yellow gun allow print dead spot desert suit current lift rose continue block chart hat
		sell success company subtract event particular deal swim term opposite wife shoe shoulder spread
		arrange camp invent cotton born determine quart nine truck noise level chance gather shop stretch
		throw shine property column molecule select wrong gray repeat require broad prepare salt nose plural
		anger claim continent oxygen sugar death pretty skill women season solution magnet silver thank
		branch match suffix especially fig afraid huge sister steel discuss forward similar guide experience
		score apple bought led pitch coat mass card band rope slip win dream evening condition feed tool
		total basic smell valley nor double seat arrive master track parent shore division sheet substance
		favor connect post spend chord fat glad original share station dad bread charge proper bar offer
		segment slave duck instant market degree populate chick dear enemy reply drink occur support speech
		nature range steam motion path liquid log meant quotient teeth shell neck`)
	rng := rand.New(rand.NewPCG(11, 12))
	pick := func() string {
		// Skewed: low indexes (frequent words) far more often.
		f := rng.Float64()
		return words[int(f*f*f*float64(len(words)))]
	}
	var sb strings.Builder
	for sb.Len() < n {
		w := pick()
		sb.WriteString(strings.ToUpper(w[:1]) + w[1:])
		for k, m := 0, 4+rng.IntN(16); k < m; k++ {
			switch r := rng.IntN(40); {
			case r == 0:
				sb.WriteString(",")
			case r == 1:
				sb.WriteString(" " + []string{"1990", "42", "3.5", "2026", "100", "7"}[rng.IntN(6)])
			case r == 2:
				sb.WriteString(" \"" + pick() + "\"")
			case r == 3:
				sb.WriteString(" (" + pick() + ")")
			}
			w := pick()
			if rng.IntN(25) == 0 {
				w = strings.ToUpper(w[:1]) + w[1:]
			}
			sb.WriteString(" " + w)
		}
		sb.WriteString([]string{". ", ". ", ". ", "? ", "! ", ".\n\n", "; "}[rng.IntN(7)])
	}
	return sb.String()
}
